package api

import (
	"encoding/json"
	"errors"

	"github.com/mqd/mqd/internal/refusal"
	"github.com/mqd/mqd/replica"
	"github.com/valyala/fasthttp"
)

// Errors of the HTTP layer itself.
var (
	ErrBadRequest   = errors.New("bad request")
	ErrBadHeader    = errors.New("bad header")
	ErrNotFound     = errors.New("not found")
	ErrMethod       = errors.New("method not allowed")
	ErrBodyTooLarge = errors.New("request too large")
	ErrUnavailable  = errors.New("unavailable")
	// ErrHeaderTooLarge: the request head does not fit the read buffer.
	ErrHeaderTooLarge = errors.New("request header too large")
	// ErrRequestTimeout: the request was not received within the read timeout.
	ErrRequestTimeout = errors.New("request timeout")
	// ErrUnauthenticated: no token, or one the auth file does not know.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrForbidden: a known token without the permission the route needs.
	ErrForbidden = errors.New("forbidden")
)

// statusClientGone is recorded for a request whose client left first.
const statusClientGone = 499

type apiError struct {
	status int
	code   string
}

// catalogue is the one place that maps errors to statuses and stable
// codes: the first entry whose error the answer wraps decides. Anything
// else is 500 internal. The OpenAPI document lists every code (a test
// checks).
var catalogue = buildCatalogue()

type catalogueEntry struct {
	err error
	apiError
}

// buildCatalogue: authentication, every refusal (each carries its status
// and code: package refusal, the catalogue the FSM's refuse-don't-panic
// decision also reads), the HTTP layer's own errors, the node's failures.
func buildCatalogue() []catalogueEntry {
	out := []catalogueEntry{
		{ErrUnauthenticated, apiError{401, "unauthenticated"}},
		{ErrForbidden, apiError{403, "forbidden"}},
		{ErrRateLimited, apiError{429, "rate_limited"}},
	}
	// A refusal is more specific than the HTTP errors that may wrap it
	// ("bad request: invalid name"), so it decides first.
	for _, r := range refusal.All() {
		out = append(out, catalogueEntry{r, apiError{r.Status, r.Code}})
	}
	out = append(out, []catalogueEntry{
		{ErrNotFound, apiError{404, "not_found"}},
		{ErrMethod, apiError{405, "method_not_allowed"}},
		{ErrBadHeader, apiError{400, "bad_header"}},
		{ErrBadRequest, apiError{400, "bad_request"}},
		{ErrBodyTooLarge, apiError{413, "request_too_large"}},
		{ErrHeaderTooLarge, apiError{431, "header_too_large"}},
		{ErrRequestTimeout, apiError{408, "request_timeout"}},
	}...)
	return append(out,
		catalogueEntry{replica.ErrNoQuorum, apiError{503, "no_quorum"}},
		catalogueEntry{replica.ErrNotLeader, apiError{503, "no_leader"}},
		catalogueEntry{replica.ErrShutdown, apiError{503, "shutting_down"}},
		catalogueEntry{ErrUnavailable, apiError{503, "unavailable"}},
	)
}

// classify answers err's status and code from the catalogue.
func classify(err error) apiError {
	for _, t := range catalogue {
		if errors.Is(err, t.err) {
			return t.apiError
		}
	}
	return apiError{500, "internal"}
}

// errorBody is the JSON of every error answer; appendErrorBody writes it.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// writeError answers err as JSON with its status.
func writeError(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, ErrClientGone) {
		// Nobody reads the answer: close, and let the metrics count a
		// 499 (the code nginx logs for it).
		ctx.SetStatusCode(statusClientGone)
		ctx.SetConnectionClose()
		return
	}
	ae := classify(err)
	switch ae.status {
	case 401:
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
	case 429:
		if v, ok := retryAfter(err); ok {
			ctx.Response.Header.Set("Retry-After", v)
		}
	case 503:
		ctx.Response.Header.Set("Retry-After", "1")
	}
	var a [512]byte
	writeBody(ctx, ae.status, appendErrorBody(a[:0], ae.code, err.Error()))
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = 500, []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	writeBody(ctx, status, b)
}
