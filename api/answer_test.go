package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/mqd/mqd/replica"
	"github.com/valyala/fasthttp"
)

// jsonAnswer is how answers were written before the append encoders:
// encoding/json, then the same headers and the trailing newline. The
// append encoders must give the same response, byte for byte.
func jsonAnswer(status int, v any) string {
	var ctx fasthttp.RequestCtx
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.Header.Set("Content-Length", strconv.Itoa(len(b)+1))
	ctx.SetBody(append(b, '\n'))
	return ctx.Response.String()
}

// respOf runs write on a fresh response and returns the whole of it.
func respOf(write func(ctx *fasthttp.RequestCtx)) string {
	var ctx fasthttp.RequestCtx
	write(&ctx)
	return ctx.Response.String()
}

func TestAnswersMatchJSON(t *testing.T) {
	ps := []fsm.Published{{Partition: 0, Offset: 0}, {Partition: 7, Offset: 1<<64 - 1, Duplicate: true}, {Partition: 1<<32 - 1, Offset: 12345}}
	for _, topic := range []string{"orders", "a.b_c-D9", strings.Repeat("t", 200)} {
		for _, p := range ps {
			for _, status := range []int{201, 200} {
				want := jsonAnswer(status, publishAnswer{Topic: topic, Partition: p.Partition, Offset: p.Offset, Duplicate: p.Duplicate})
				if got := respOf(func(ctx *fasthttp.RequestCtx) { writePublished(ctx, status, topic, p) }); got != want {
					t.Errorf("publish %s %+v %d:\n got %q\nwant %q", topic, p, status, got, want)
				}
			}
		}
		for _, n := range []int{1, 3, 1000} {
			batch := make([]fsm.Published, n)
			out := make([]publishAnswer, n)
			for i := range batch {
				batch[i] = ps[i%len(ps)]
				out[i] = publishAnswer{Topic: topic, Partition: batch[i].Partition, Offset: batch[i].Offset, Duplicate: batch[i].Duplicate}
			}
			want := jsonAnswer(200, map[string]any{"results": out})
			if got := respOf(func(ctx *fasthttp.RequestCtx) { writeBatchPublished(ctx, topic, batch) }); got != want {
				t.Errorf("batch of %d on %s:\n got %.300q\nwant %.300q", n, topic, got, want)
			}
		}
	}
}

// Error answers: every status class (with its extra headers) and messages
// that need escaping.
func TestErrorAnswersMatchJSON(t *testing.T) {
	errs := []error{
		fmt.Errorf("%w: Mq-Producer-Id and Mq-Producer-Seq go together", ErrBadHeader),
		fmt.Errorf("%w: topic %q must match [A-Za-z0-9._-]{1,200}", mlog.ErrInvalidName, "a\"b\\c<d>&e\x01\x1f\t\n\r\b\f"),
		fmt.Errorf("%w: bad \xff\xfe utf-8 and \u2028 \u2029 and é 日本", ErrBadRequest),
		fmt.Errorf("%w: token %q lacks publish:orders", ErrForbidden, "t"),
		fmt.Errorf("%w: unknown token", ErrUnauthenticated),
		fmt.Errorf("%w: leader address unknown", replica.ErrNotLeader),
		errors.New("disk on fire"),
		fmt.Errorf("%w: %s", ErrBadRequest, strings.Repeat("long message ", 100)),
	}
	for _, err := range errs {
		ae := classify(err)
		var ref fasthttp.RequestCtx
		var body errorBody
		body.Error.Code, body.Error.Message = ae.code, err.Error()
		// writeError's headers, then the body as encoding/json wrote it.
		switch ae.status {
		case 401:
			ref.Response.Header.Set("WWW-Authenticate", "Bearer")
		case 503:
			ref.Response.Header.Set("Retry-After", "1")
		}
		b, _ := json.Marshal(body)
		ref.SetStatusCode(ae.status)
		ref.SetContentType("application/json")
		ref.Response.Header.Set("Content-Length", strconv.Itoa(len(b)+1))
		ref.SetBody(append(b, '\n'))
		want := ref.Response.String()
		if got := respOf(func(ctx *fasthttp.RequestCtx) { writeError(ctx, err) }); got != want {
			t.Errorf("error %v:\n got %q\nwant %q", err, got, want)
		}
	}
}
