package refusal

import (
	"errors"
	"fmt"
	"testing"
)

func TestAsThroughWrapping(t *testing.T) {
	r := New(409, "test_conflict", "test conflict")
	err := fmt.Errorf("publish: %w", fmt.Errorf("partition 3: %w", r))
	got, ok := As(err)
	if !ok || got != r || !errors.Is(err, r) || got.Status != 409 || got.Code != "test_conflict" {
		t.Fatalf("As(%v) = %v, %v", err, got, ok)
	}
	if Is(errors.New("disk on fire")) {
		t.Fatal("a plain error is not a refusal")
	}
	found := false
	for _, e := range All() {
		found = found || e == r
	}
	if !found {
		t.Fatal("All() misses a refusal made by New")
	}
}
