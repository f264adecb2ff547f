package log

import (
	"bytes"
	"fmt"
)

// Attr is one application attribute (Mq-Attr-{Name}).
type Attr struct {
	Name, Value string
}

// Message is one stored message. Retry fields of -1 mean "the topic's".
type Message struct {
	Offset          uint64 // not stored: the record's key
	PublishedAt     int64  // unix ms, stamped by the leader
	DeliverAt       int64  // unix ms; 0 = at once
	IdempotencyKey  string
	MaxRetry        int64
	BackoffBaseMs   int64
	BackoffJitterMs int64
	Attrs           []Attr
	Value           []byte
}

const messageVersion = 1

func (m *Message) encode() []byte {
	var e Enc
	e.B = make([]byte, 0, 32+len(m.IdempotencyKey)+len(m.Value))
	m.Encode(&e)
	return e.B
}

// Encode appends the message (without its offset) to e.
func (m *Message) Encode(e *Enc) {
	e.Byte(messageVersion)
	e.I64(m.PublishedAt)
	e.I64(m.DeliverAt)
	e.Str(m.IdempotencyKey)
	e.I64(m.MaxRetry)
	e.I64(m.BackoffBaseMs)
	e.I64(m.BackoffJitterMs)
	e.U64(uint64(len(m.Attrs)))
	for _, a := range m.Attrs {
		e.Str(a.Name)
		e.Str(a.Value)
	}
	e.Bytes(m.Value)
}

// DecodeMessage reads what Encode wrote. Value aliases d's buffer.
func DecodeMessage(d *Dec) *Message {
	m := &Message{}
	if v := d.Byte(); v != messageVersion && d.Err() == nil {
		d.fail(fmt.Sprintf("message version %d", v))
		return m
	}
	m.PublishedAt = d.I64()
	m.DeliverAt = d.I64()
	m.IdempotencyKey = d.Str()
	m.MaxRetry = d.I64()
	m.BackoffBaseMs = d.I64()
	m.BackoffJitterMs = d.I64()
	n := d.Len(2)
	if n > 0 {
		m.Attrs = make([]Attr, n)
		for i := range m.Attrs {
			m.Attrs[i] = Attr{Name: d.Str(), Value: d.Str()}
		}
	}
	m.Value = d.Bytes()
	return m
}

func decodeMessage(b []byte) (*Message, error) {
	d := Dec{B: b}
	m := DecodeMessage(&d)
	return m, d.Err()
}

// Clone returns a deep copy whose Value does not alias a transaction.
func (m *Message) Clone() *Message {
	c := *m
	c.Value = bytes.Clone(m.Value)
	c.Attrs = append([]Attr(nil), m.Attrs...)
	return &c
}
