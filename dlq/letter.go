package dlq

import (
	"fmt"

	mlog "github.com/mqd/mqd/log"
)

// Failure kinds in a message's history.
const (
	KindNack         = "nack"          // a retryable nack
	KindLeaseExpired = "lease_expired" // the lease ran out
	KindRejected     = "rejected"      // a non-retryable nack
)

// Failure is one failed delivery.
type Failure struct {
	At     int64  `json:"-"` // unix ms
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	Node   string `json:"node"`
}

// MaxHistory bounds the failures kept per message: the first one and the
// latest MaxHistory-1 (retry_count still counts them all).
const MaxHistory = 64

// AppendHistory adds f to h, keeping at most MaxHistory entries.
func AppendHistory(h []Failure, f Failure) []Failure {
	h = append(h, f)
	if len(h) > MaxHistory {
		h = append(h[:1], h[len(h)-MaxHistory+1:]...)
	}
	return h
}

// EncodeHistory appends h to e.
func EncodeHistory(e *mlog.Enc, h []Failure) {
	e.U64(uint64(len(h)))
	for _, f := range h {
		e.I64(f.At)
		e.Str(f.Kind)
		e.Str(f.Reason)
		e.Str(f.Node)
	}
}

// DecodeHistory reads what EncodeHistory wrote.
func DecodeHistory(d *mlog.Dec) []Failure {
	n := d.Len(4)
	if n == 0 {
		return nil
	}
	h := make([]Failure, n)
	for i := range h {
		h[i] = Failure{At: d.I64(), Kind: d.Str(), Reason: d.Str(), Node: d.Str()}
	}
	return h
}

// Letter is one dead letter.
type Letter struct {
	ID           uint64
	Partition    uint32
	Offset       uint64
	Msg          *mlog.Message
	RejectReason string
	RetryCount   uint32
	DeadAt       int64
	History      []Failure
}

const letterVersion = 1

func (l *Letter) encode() []byte {
	var e mlog.Enc
	e.Byte(letterVersion)
	e.U64(uint64(l.Partition))
	e.U64(l.Offset)
	e.Str(l.RejectReason)
	e.U64(uint64(l.RetryCount))
	e.I64(l.DeadAt)
	EncodeHistory(&e, l.History)
	l.Msg.Encode(&e)
	return e.B
}

func decodeLetter(id uint64, b []byte) (*Letter, error) {
	d := mlog.Dec{B: b}
	if v := d.Byte(); v != letterVersion && d.Err() == nil {
		return nil, fmt.Errorf("%w: dead letter version %d", mlog.ErrCorrupt, v)
	}
	l := &Letter{ID: id, Partition: uint32(d.U64()), Offset: d.U64(), RejectReason: d.Str(),
		RetryCount: uint32(d.U64()), DeadAt: d.I64(), History: DecodeHistory(&d)}
	l.Msg = mlog.DecodeMessage(&d)
	if err := d.Err(); err != nil {
		return nil, err
	}
	l.Msg = l.Msg.Clone()
	return l, nil
}
