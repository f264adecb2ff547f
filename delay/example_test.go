package delay_test

import (
	"fmt"
	"time"

	"github.com/mqd/mqd/delay"
)

// stepClock is a Clock a test moves by hand.
type stepClock struct{ t time.Time }

func (c *stepClock) Now() time.Time { return c.t }

func Example() {
	clk := &stepClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	w, err := delay.New[string](delay.Config{Clock: clk})
	if err != nil {
		panic(err)
	}
	w.Add(clk.t.Add(2*time.Second), "redeliver m2")
	w.Add(clk.t.Add(time.Second), "lease l1 expired")
	acked := w.Add(clk.t.Add(time.Second), "lease l2 expired")
	w.Cancel(acked) // acked before its lease ran out

	clk.t = clk.t.Add(1500 * time.Millisecond)
	fmt.Println(w.Advance(clk.Now()), w.Len())
	clk.t = clk.t.Add(time.Hour)
	fmt.Println(w.Advance(clk.Now()), w.Len())
	// Output:
	// [lease l1 expired] 1
	// [redeliver m2] 0
}
