package api

import (
	_ "embed"

	"github.com/valyala/fasthttp"
)

// openapiDoc is the OpenAPI 3.1 description of every route in routes();
// TestOpenAPI keeps the two in step.
//
//go:embed openapi.yaml
var openapiDoc []byte

func (s *Server) openapi(ctx *fasthttp.RequestCtx, _ *route) error {
	ctx.SetStatusCode(200)
	ctx.SetContentType("application/yaml")
	ctx.SetBody(openapiDoc)
	return nil
}
