package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// The fixed answers to refused connections are whole HTTP answers whose
// Content-Length is their JSON body's: a client reads the error entire.
func TestFixedConnectionAnswers(t *testing.T) {
	for _, c := range []struct {
		raw    []byte
		status int
	}{{rejectTotal, 503}, {rejectPerIP, 429}} {
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(c.raw)), nil)
		if err != nil {
			t.Fatalf("%q: %v", c.raw, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != "too_many_connections" || e.Error.Message == "" {
			t.Errorf("%d answer: body %q (%v), want the whole too_many_connections error", c.status, body, err)
		}
		sent := len(c.raw) - bytes.Index(c.raw, []byte("\r\n\r\n")) - 4
		if resp.StatusCode != c.status || resp.Header.Get("Retry-After") != "1" || int64(sent) != resp.ContentLength {
			t.Errorf("%d answer: status %d, Retry-After %q, Content-Length %d for a %d-byte body", c.status, resp.StatusCode,
				resp.Header.Get("Retry-After"), resp.ContentLength, sent)
		}
	}
}
