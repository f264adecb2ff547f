package group

import (
	"encoding/base64"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestReceiptRoundTrip(t *testing.T) {
	for _, r := range []Receipt{
		{},
		{Partition: 3, Offset: 17, Delivery: 42},
		{Partition: math.MaxUint32, Offset: math.MaxUint64, Delivery: math.MaxUint64},
	} {
		s := r.Encode("orders", "billing")
		if strings.ContainsAny(s, "+/=") {
			t.Errorf("receipt %q is not raw URL-safe base64", s)
		}
		got, err := ParseReceipt(s, "orders", "billing")
		if err != nil || got != r {
			t.Errorf("ParseReceipt(Encode(%+v)) = %+v, %v", r, got, err)
		}
	}
}

func TestReceiptBoundToTopicAndGroup(t *testing.T) {
	s := Receipt{Partition: 1, Offset: 2, Delivery: 3}.Encode("orders", "billing")
	for _, tg := range [][2]string{
		{"orders", "shipping"},
		{"payments", "billing"},
		{"ordersb", "illing"}, // same bytes concatenated, different split
		{"orders", "billing "},
		{"", ""},
	} {
		if _, err := ParseReceipt(s, tg[0], tg[1]); !errors.Is(err, ErrBadReceipt) {
			t.Errorf("receipt for orders/billing parsed for %s/%s: err = %v", tg[0], tg[1], err)
		}
	}
}

func TestParseReceiptGarbage(t *testing.T) {
	good := Receipt{Partition: 1, Offset: 2, Delivery: 3}.Encode("t", "g")
	raw, err := base64.RawURLEncoding.DecodeString(good)
	if err != nil {
		t.Fatal(err)
	}
	flipped := func(i int) string {
		b := append([]byte(nil), raw...)
		b[i] ^= 0x01
		return base64.RawURLEncoding.EncodeToString(b)
	}
	wrongVersion := append([]byte(nil), raw...)
	wrongVersion[0] = 2
	bad := []string{
		"",
		"not a receipt",
		"!!!!",
		good + "A",
		good[:len(good)-1],
		good + "==",
		base64.StdEncoding.EncodeToString(raw), // padded standard alphabet
		base64.RawURLEncoding.EncodeToString(raw[:receiptLen-1]),
		base64.RawURLEncoding.EncodeToString(append(raw, 0)),
		base64.RawURLEncoding.EncodeToString(wrongVersion),
		flipped(2),  // partition
		flipped(10), // offset
		flipped(20), // delivery
		flipped(24), // checksum
	}
	for _, s := range bad {
		if r, err := ParseReceipt(s, "t", "g"); !errors.Is(err, ErrBadReceipt) || r != (Receipt{}) {
			t.Errorf("ParseReceipt(%q) = %+v, %v; want ErrBadReceipt", s, r, err)
		}
	}
}

func FuzzParseReceipt(f *testing.F) {
	f.Add(Receipt{Partition: 1, Offset: 2, Delivery: 3}.Encode("t", "g"))
	f.Add("")
	f.Add("AQAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseReceipt(s, "t", "g")
		if err != nil {
			if !errors.Is(err, ErrBadReceipt) {
				t.Fatalf("unexpected error type %v", err)
			}
			return
		}
		if again, err := ParseReceipt(r.Encode("t", "g"), "t", "g"); err != nil || again != r {
			t.Fatalf("re-encode of %+v: %+v, %v", r, again, err)
		}
	})
}
