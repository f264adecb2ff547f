package chaos

import (
	"bufio"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip dials addr, sends a line and waits up to d for it to come back.
func roundTrip(addr string, d time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTripOn(c, d)
}

func roundTripOn(c net.Conn, d time.Duration) error {
	c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

// The proxy identifies the dialing process through /proc and enforces
// partitions in both modes; heal restores the link.
func TestProxyPartition(t *testing.T) {
	self := os.Getpid()
	nw := NewNet(func() []int { return []int{self} }, func(pid int) string {
		if pid == self {
			return "a"
		}
		return ""
	})
	defer nw.Close()
	p, err := nw.NewProxy("b")
	if err != nil {
		t.Fatal(err)
	}
	p.SetTarget(echoServer(t))

	// Whole: traffic flows, and the dialer is identified as "a".
	long, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	if err := roundTripOn(long, 2*time.Second); err != nil {
		t.Fatalf("whole network: %v", err)
	}
	if got := nw.identified.Load(); got != 1 {
		t.Fatalf("identified %d connections, want 1 (%s)", got, nw.Stats())
	}

	// Reject: the open connection is cut, new ones are closed at once.
	nw.Partition(Reject, []string{"a"}, []string{"b"})
	if err := roundTripOn(long, 2*time.Second); err == nil {
		t.Fatal("reject: an existing connection still carries traffic")
	}
	start := time.Now()
	if err := roundTrip(p.Addr(), 2*time.Second); err == nil {
		t.Fatal("reject: a new connection carries traffic")
	} else if time.Since(start) > time.Second {
		t.Fatalf("reject: took %v to fail (%v), want at once", time.Since(start), err)
	}
	nw.Heal()
	if err := roundTrip(p.Addr(), 2*time.Second); err != nil {
		t.Fatalf("after heal: %v", err)
	}

	// Blackhole: an open connection and a new one both time out; heal closes
	// the blackholed connection and new ones work.
	long2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer long2.Close()
	if err := roundTripOn(long2, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	nw.Partition(Blackhole, []string{"a"}, []string{"b"})
	err = roundTripOn(long2, 300*time.Millisecond)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("blackhole: existing connection: %v, want a timeout", err)
	}
	err = roundTrip(p.Addr(), 300*time.Millisecond)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("blackhole: new connection: %v, want a timeout", err)
	}
	nw.Heal()
	long2.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := long2.Read(make([]byte, 1)); err == nil {
		t.Fatal("heal: the blackholed connection is still open")
	}
	if err := roundTrip(p.Addr(), 2*time.Second); err != nil {
		t.Fatalf("after heal: %v", err)
	}

	// Same side: allowed.
	nw.Partition(Reject, []string{"a", "b"}, []string{"c"})
	if err := roundTrip(p.Addr(), 2*time.Second); err != nil {
		t.Fatalf("same side: %v", err)
	}
	nw.Heal()
}
