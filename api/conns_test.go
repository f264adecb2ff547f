package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
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

// clientGone sees a client's close after the read deadline the request
// left on the connection has passed, as it has for a long-poll parked
// longer than the read timeout: the peek does not go through the poller,
// which refuses at once on a past deadline.
func TestClientGoneAfterReadDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if err := server.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if clientGone(server) {
		t.Fatal("clientGone while the client is connected")
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for peekSocket(server) != peekData {
		if time.Now().After(deadline) {
			t.Fatalf("peek: %v, want bytes to read", peekSocket(server))
		}
		time.Sleep(time.Millisecond)
	}
	if clientGone(server) {
		t.Fatal("clientGone with a byte to read from the client")
	}
	buf := make([]byte, 1)
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := server.Read(buf); err != nil {
		t.Fatal(err)
	}
	_ = server.SetReadDeadline(time.Now().Add(-time.Second))
	client.Close()
	for !clientGone(server) {
		if time.Now().After(deadline) {
			t.Fatalf("clientGone false after the client closed (peek: %v)", peekSocket(server))
		}
		time.Sleep(time.Millisecond)
	}
}
