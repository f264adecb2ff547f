package group

import (
	"bytes"
	"fmt"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// A group keeps outcomes up to its weight bound: past it the oldest go
// first, with every receipt entry that pointed to them; a kept one is
// found only with exactly its receipts and delivery ids.
func TestOutcomesBoundedOldestFirst(t *testing.T) {
	defer func(w uint64) { maxOutcomeWeight = w }(maxOutcomeWeight)
	maxOutcomeWeight = 10
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	call := func(i int) []Receipt {
		return []Receipt{{Offset: uint64(3 * i), Delivery: 7}, {Offset: uint64(3*i + 1), Delivery: 7}, {Offset: uint64(3*i + 2), Delivery: 7}}
	}
	for i := range 5 { // weight 3 + 1 output each
		withGroup(t, db, "t", "g", func(g *Group) error {
			return g.RecordOutcome(uint64(100+i), 1000, 60000, call(i), 1, []byte(fmt.Sprintf("call %d", i)))
		})
	}
	viewGroup(t, db, "t", "g", func(tx *bolt.Tx, g *Group) {
		if w := g.outcomeWeight(); w != 8 {
			t.Fatalf("weight %d, want 8 (two calls of 4 kept under a bound of 10)", w)
		}
		for i := range 5 {
			p, ok, err := g.Outcome(call(i), 1001)
			if err != nil {
				t.Fatal(err)
			}
			if kept := i >= 3; ok != kept || (kept && !bytes.Equal(p, []byte(fmt.Sprintf("call %d", i)))) {
				t.Fatalf("call %d: outcome %q found %v, want found %v", i, p, ok, kept)
			}
		}
		if n := g.b.Bucket(bktOutcomeByRcpt).Stats().KeyN; n != 6 {
			t.Fatalf("%d receipt entries, want 6", n)
		}
		if _, ok, _ := g.Outcome(call(4)[:2], 1001); ok {
			t.Fatal("two of a call's three receipts found its outcome")
		}
		other := call(4)
		other[1].Delivery = 8
		if _, ok, _ := g.Outcome(other, 1001); ok {
			t.Fatal("a receipt of another delivery found the outcome")
		}
		if _, ok, _ := g.Outcome(call(4), 1000+60000); ok {
			t.Fatal("an outcome past its window was found")
		}
	})
}
