package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"testing"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/internal/refusal"
	mlog "github.com/mqd/mqd/log"
	"github.com/mqd/mqd/replica"
	"github.com/valyala/fasthttp"
)

// answer runs writeError on a fresh request context and returns the
// status, headers and decoded body.
func answer(t *testing.T, err error) (int, *fasthttp.ResponseHeader, errorBody) {
	t.Helper()
	var ctx fasthttp.RequestCtx
	writeError(&ctx, err)
	var b errorBody
	body := ctx.Response.Body()
	if jerr := json.Unmarshal(body, &b); jerr != nil {
		t.Fatalf("error body %q is not JSON: %v", body, jerr)
	}
	// The body is exactly {"error":{"code","message"}}.
	var raw map[string]map[string]any
	if jerr := json.Unmarshal(body, &raw); jerr != nil || len(raw) != 1 || len(raw["error"]) != 2 {
		t.Fatalf("error body %s has another shape", body)
	}
	if cl := ctx.Response.Header.ContentLength(); cl != len(body) {
		t.Fatalf("Content-Length %d for a %d-byte body", cl, len(body))
	}
	return ctx.Response.StatusCode(), &ctx.Response.Header, b
}

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

func TestWriteErrorClassification(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   string
	}{
		{mlog.ErrTopicNotFound, 404, "topic_not_found"},
		{group.ErrGroupNotFound, 404, "group_not_found"},
		{ErrNotFound, 404, "not_found"},
		{ErrMethod, 405, "method_not_allowed"},
		{mlog.ErrInvalidName, 400, "invalid_name"},
		{mlog.ErrInvalidConfig, 400, "invalid_config"},
		{ErrBadHeader, 400, "bad_header"},
		{ErrBadRequest, 400, "bad_request"},
		{mlog.ErrPartitionShrink, 409, "partitions_shrink"},
		{fsm.ErrSeqGap, 409, "sequence_gap"},
		{fsm.ErrSeqOverlap, 409, "sequence_overlap"},
		{ErrHeaderTooLarge, 431, "header_too_large"},
		{ErrRequestTimeout, 408, "request_timeout"},
		{mlog.ErrTooLarge, 413, "message_too_large"},
		{ErrBodyTooLarge, 413, "request_too_large"},
		{mlog.ErrTopicFull, 507, "topic_full"},
		{replica.ErrNoQuorum, 503, "no_quorum"},
		{replica.ErrNotLeader, 503, "no_leader"},
		{replica.ErrShutdown, 503, "shutting_down"},
		{ErrUnavailable, 503, "unavailable"},
		{errors.New("disk on fire"), 500, "internal"},
		{mlog.ErrCorrupt, 500, "internal"},
	}
	for _, c := range cases {
		for _, err := range []error{c.err, fmt.Errorf("context: %w", c.err), fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", c.err))} {
			status, hdr, b := answer(t, err)
			if status != c.status || b.Error.Code != c.code {
				t.Errorf("%v: %d %q, want %d %q", err, status, b.Error.Code, c.status, c.code)
			}
			if b.Error.Message != err.Error() {
				t.Errorf("%v: message %q", err, b.Error.Message)
			}
			if ct := string(hdr.ContentType()); ct != "application/json" {
				t.Errorf("%v: Content-Type %q", err, ct)
			}
			ra := string(hdr.Peek("Retry-After"))
			if c.status == 503 {
				if n, perr := strconv.Atoi(ra); perr != nil || n < 1 {
					t.Errorf("%v: 503 without a Retry-After in seconds (%q)", err, ra)
				}
			} else if ra != "" {
				t.Errorf("%v: Retry-After %q on a %d", err, ra, c.status)
			}
		}
		if !snakeCase.MatchString(c.code) {
			t.Errorf("code %q is not snake_case", c.code)
		}
	}
}

func TestClassifyPrefersSpecificErrors(t *testing.T) {
	// A no-quorum wrapped with its context error is still 503.
	err := fmt.Errorf("%w: %w", replica.ErrNoQuorum, errors.New("context deadline exceeded"))
	if st := classify(err); st.status != 503 || st.code != "no_quorum" {
		t.Fatalf("classify(%v) = %+v", err, st)
	}
	// A bad name reported through a bad request keeps its specific code.
	err = fmt.Errorf("%w: %w", ErrBadRequest, mlog.ErrInvalidName)
	if st := classify(err); st.status != 400 || st.code != "invalid_name" {
		t.Fatalf("classify(%v) = %+v", err, st)
	}
}

// fnv1a32 is the reference FNV-1a 32-bit hash.
func fnv1a32(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	return h
}

func TestPartitionFor(t *testing.T) {
	// Published FNV-1a 32 test vectors, so that clients in any language
	// can compute the same placement.
	vectors := map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968}
	for key, h := range vectors {
		for _, n := range []uint32{1, 2, 3, 7, 16, 1024} {
			if got := PartitionFor(key, n); got != h%n {
				t.Errorf("PartitionFor(%q, %d) = %d, want %d", key, n, got, h%n)
			}
		}
	}
	if got := PartitionFor("foobar", 1000); got != 0xbf9cf968%1000 {
		t.Fatalf("PartitionFor(foobar, 1000) = %d", got)
	}
	for i := range 2000 {
		key := fmt.Sprintf("order-%d\x00\xff", i)
		n := uint32(i%31 + 1)
		if got, want := PartitionFor(key, n), fnv1a32([]byte(key))%n; got != want {
			t.Fatalf("PartitionFor(%q, %d) = %d, want %d", key, n, got, want)
		}
	}
	// It spreads keys: every one of 8 partitions gets some of 1000 keys.
	seen := map[uint32]int{}
	for i := range 1000 {
		seen[PartitionFor(strconv.Itoa(i), 8)]++
	}
	if len(seen) != 8 {
		t.Fatalf("1000 keys landed on %d of 8 partitions", len(seen))
	}
}

func FuzzPartitionFor(f *testing.F) {
	f.Add("key", uint32(3))
	f.Add("", uint32(1))
	f.Fuzz(func(t *testing.T, key string, n uint32) {
		if n == 0 {
			return
		}
		h := fnv.New32a()
		h.Write([]byte(key))
		if got := PartitionFor(key, n); got >= n || got != h.Sum32()%n || got != fnv1a32([]byte(key))%n {
			t.Fatalf("PartitionFor(%q, %d) = %d", key, n, got)
		}
	})
}

// The status mapping is derived from the refusal catalogue: every refusal,
// wrapped, answers its own status and code.
func TestClassifyEveryRefusal(t *testing.T) {
	for _, r := range refusal.All() {
		got := classify(fmt.Errorf("op: %w", r))
		if got.status != r.Status || got.code != r.Code {
			t.Errorf("classify(%s) = %+v, want %d %s", r.Code, got, r.Status, r.Code)
		}
	}
}
