package api

import (
	"strconv"
	"sync"

	"github.com/mqd/mqd/fsm"
	"github.com/valyala/fasthttp"
)

// The answers a publish and an error send on every request are encoded by
// appending into a reused buffer, not by encoding/json (a reflection walk
// and a fresh slice per answer). The bytes are the ones encoding/json
// gives for publishAnswer, {"results": [...]} and errorBody, field order
// and escaping included: TestAnswerEncodingMatchesJSON compares them.

// answerBufs holds the buffers of answers too large for the stack (a
// batch's results).
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// writeBody answers status with the JSON value b (to which the newline
// that ends every answer is appended here).
func writeBody(ctx *fasthttp.RequestCtx, status int, b []byte) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.Header.SetContentLength(len(b) + 1)
	ctx.Response.SetBody(b) // copied into the response's own (pooled) buffer
	ctx.Response.AppendBody(newline)
}

var newline = []byte{'\n'}

// writePublished answers one publish.
func writePublished(ctx *fasthttp.RequestCtx, status int, topic string, p fsm.Published) {
	var a [320]byte // a 200-byte topic name fits
	writeBody(ctx, status, appendPublishAnswer(a[:0], topic, p))
}

// writeBatchPublished answers a batch publish: {"results":[...]}.
func writeBatchPublished(ctx *fasthttp.RequestCtx, topic string, ps []fsm.Published) {
	bp := answerBufs.Get().(*[]byte)
	b := append((*bp)[:0], `{"results":[`...)
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendPublishAnswer(b, topic, p)
	}
	b = append(b, "]}"...)
	writeBody(ctx, 200, b)
	if cap(b) <= 1<<20 { // a pool of rare huge buffers would hold them forever
		*bp = b
		answerBufs.Put(bp)
	}
}

// appendPublishAnswer appends publishAnswer's JSON.
func appendPublishAnswer(b []byte, topic string, p fsm.Published) []byte {
	b = append(b, `{"topic":`...)
	b = appendJSONString(b, topic)
	b = append(b, `,"partition":`...)
	b = strconv.AppendUint(b, uint64(p.Partition), 10)
	b = append(b, `,"offset":`...)
	b = strconv.AppendUint(b, p.Offset, 10)
	b = append(b, `,"duplicate":`...)
	b = strconv.AppendBool(b, p.Duplicate)
	return append(b, '}')
}

// appendErrorBody appends errorBody's JSON.
func appendErrorBody(b []byte, code, message string) []byte {
	b = append(b, `{"error":{"code":`...)
	b = appendJSONString(b, code)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, message)
	return append(b, "}}"...)
}
