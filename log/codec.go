package log

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt reports a stored record that cannot be decoded. It means the
// database was damaged or written by an incompatible version.
var ErrCorrupt = errors.New("corrupt record")

// Enc appends primitive values to a byte slice. The zero value is ready.
// It is shared by every binary record and command codec in mqd so that all of
// them use one varint and length-prefix convention.
type Enc struct{ B []byte }

// U64 appends an unsigned varint.
func (e *Enc) U64(v uint64) { e.B = binary.AppendUvarint(e.B, v) }

// I64 appends a signed varint.
func (e *Enc) I64(v int64) { e.B = binary.AppendVarint(e.B, v) }

// Byte appends one byte.
func (e *Enc) Byte(v byte) { e.B = append(e.B, v) }

// Bool appends a bool as one byte.
func (e *Enc) Bool(v bool) {
	if v {
		e.B = append(e.B, 1)
	} else {
		e.B = append(e.B, 0)
	}
}

// Bytes appends a length-prefixed byte string.
func (e *Enc) Bytes(v []byte) { e.U64(uint64(len(v))); e.B = append(e.B, v...) }

// Str appends a length-prefixed string.
func (e *Enc) Str(v string) { e.U64(uint64(len(v))); e.B = append(e.B, v...) }

// Dec reads what Enc wrote. The first error sticks: after it every read
// returns a zero value, and Err reports it.
type Dec struct {
	B   []byte
	err error
}

// Err returns the first decoding error, if any.
func (d *Dec) Err() error { return d.err }

func (d *Dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or invalid %s", ErrCorrupt, what)
	}
	d.B = nil
}

// U64 reads an unsigned varint.
func (d *Dec) U64() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.B)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.B = d.B[n:]
	return v
}

// I64 reads a signed varint.
func (d *Dec) I64() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.B)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.B = d.B[n:]
	return v
}

// Byte reads one byte.
func (d *Dec) Byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.B) < 1 {
		d.fail("byte")
		return 0
	}
	v := d.B[0]
	d.B = d.B[1:]
	return v
}

// Bool reads a bool.
func (d *Dec) Bool() bool { return d.Byte() != 0 }

// Bytes reads a length-prefixed byte string. The result aliases the input.
func (d *Dec) Bytes() []byte {
	n := d.U64()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.B)) {
		d.fail("bytes")
		return nil
	}
	v := d.B[:n:n]
	d.B = d.B[n:]
	return v
}

// Str reads a length-prefixed string (copied).
func (d *Dec) Str() string { return string(d.Bytes()) }

// Len reads a count of following elements, each at least min bytes long,
// rejecting counts the remaining input cannot hold (so a corrupt count never
// makes a huge allocation).
func (d *Dec) Len(min int) int {
	n := d.U64()
	if d.err != nil {
		return 0
	}
	if min < 1 {
		min = 1
	}
	if n > uint64(len(d.B)/min) {
		d.fail("count")
		return 0
	}
	return int(n)
}

// U64Key encodes v as 8 big-endian bytes, so keys sort numerically.
func U64Key(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

// PartKey encodes a partition number as 4 big-endian bytes.
func PartKey(p uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], p)
	return b[:]
}
