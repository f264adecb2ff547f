package raftmux

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, g := range []string{"a", "data-1", "meta.0_x", strings.Repeat("z", MaxGroupLen)} {
		rpc := []byte{0, 1, 2} // what raft writes after the header
		r := bytes.NewReader(append(appendHeader(nil, g), rpc...))
		got, first, err := readHeader(r)
		if err != nil || got != g || first != nil {
			t.Fatalf("%q: read %q %v %v", g, got, first, err)
		}
		if rest := r.Len(); rest != len(rpc) {
			t.Fatalf("%q: readHeader consumed %d bytes of the rpc", g, len(rpc)-rest)
		}
	}
}

// Every byte raft may start an RPC with (its types are 0..4; anything
// below the marker, for types it may add) reaches the default group and
// is given back.
func TestHeaderUntagged(t *testing.T) {
	for b := 0; b < int(groupMarker); b++ {
		r := bytes.NewReader([]byte{byte(b), 9})
		g, first, err := readHeader(r)
		if err != nil || g != Default || !bytes.Equal(first, []byte{byte(b)}) || r.Len() != 1 {
			t.Fatalf("byte %d: group %q first %v err %v, %d left", b, g, first, err, r.Len())
		}
	}
}

func TestHeaderMalformed(t *testing.T) {
	for name, in := range map[string][]byte{
		"empty":        {},
		"other high":   {0x81, 1, 'a'},
		"0xff":         {0xff},
		"no length":    {groupMarker},
		"zero length":  {groupMarker, 0},
		"too long":     {groupMarker, MaxGroupLen + 1},
		"length 255":   {groupMarker, 255},
		"short id":     {groupMarker, 5, 'a', 'b'},
		"space":        {groupMarker, 2, 'a', ' '},
		"slash":        {groupMarker, 3, '.', '/', '.'},
		"non-ascii":    {groupMarker, 2, 0xc3, 0xa9},
		"control byte": {groupMarker, 1, 0},
	} {
		if g, _, err := readHeader(bytes.NewReader(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: group %q err %v, want ErrMalformed", name, g, err)
		}
	}
}

func TestValidGroup(t *testing.T) {
	for _, bad := range []string{"", " ", "a b", "ä", strings.Repeat("a", MaxGroupLen+1), "x\n"} {
		if err := ValidGroup(bad); !errors.Is(err, ErrInvalidGroup) {
			t.Errorf("ValidGroup(%q) = %v, want ErrInvalidGroup", bad, err)
		}
	}
}

// FuzzReadHeader: any input is refused or read as a valid group, and a
// tagged header is never read past.
func FuzzReadHeader(f *testing.F) {
	f.Add([]byte{0})
	f.Add(appendHeader(nil, "data-1"))
	f.Add([]byte{groupMarker, 3, 'a'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		g, first, err := readHeader(r)
		if err != nil {
			return
		}
		read := len(in) - r.Len()
		if g == Default {
			if read != 1 || len(first) != 1 || first[0] >= groupMarker {
				t.Fatalf("untagged: read %d, first %v", read, first)
			}
			return
		}
		if ValidGroup(g) != nil || read != 2+len(g) || !bytes.Equal(in[:read], appendHeader(nil, g)) {
			t.Fatalf("tagged %q: read %d of %v", g, read, in)
		}
	})
}

func TestRefusalsOncePerPeerAndWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	r := refusals{seen: map[string]*refusal{}, now: func() time.Time { return now }}
	if ok, _ := r.allow("10.0.0.1"); !ok {
		t.Fatal("first refusal not logged")
	}
	for range 5 {
		if ok, _ := r.allow("10.0.0.1"); ok {
			t.Fatal("repeat within the window logged")
		}
	}
	if ok, _ := r.allow("10.0.0.2"); !ok {
		t.Fatal("another peer's first refusal not logged")
	}
	now = now.Add(refusalWindow)
	if ok, n := r.allow("10.0.0.1"); !ok || n != 5 {
		t.Fatalf("after the window: logged %v, suppressed %d, want true 5", ok, n)
	}
}
