package group

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// ErrBadReceipt reports a receipt string that mqd never issued.
var ErrBadReceipt = errors.New("malformed receipt")

// Receipt identifies one delivery of one message within a group.
type Receipt struct {
	Partition uint32
	Offset    uint64
	Delivery  uint64
}

const receiptLen = 1 + 4 + 8 + 8 + 4

// Encode renders the receipt as an opaque URL-safe string, bound to its
// topic and group by a checksum.
func (r Receipt) Encode(topic, group string) string {
	b := make([]byte, receiptLen)
	b[0] = 1
	binary.BigEndian.PutUint32(b[1:], r.Partition)
	binary.BigEndian.PutUint64(b[5:], r.Offset)
	binary.BigEndian.PutUint64(b[13:], r.Delivery)
	binary.BigEndian.PutUint32(b[21:], receiptSum(b[:21], topic, group))
	return base64.RawURLEncoding.EncodeToString(b)
}

func receiptSum(b []byte, topic, group string) uint32 {
	h := crc32.NewIEEE()
	h.Write(b)
	h.Write([]byte(topic))
	h.Write([]byte{0})
	h.Write([]byte(group))
	return h.Sum32()
}

// ParseReceipt decodes a receipt issued for topic and group.
func ParseReceipt(s, topic, group string) (Receipt, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != receiptLen || b[0] != 1 {
		return Receipt{}, ErrBadReceipt
	}
	if binary.BigEndian.Uint32(b[21:]) != receiptSum(b[:21], topic, group) {
		return Receipt{}, ErrBadReceipt
	}
	return Receipt{
		Partition: binary.BigEndian.Uint32(b[1:]),
		Offset:    binary.BigEndian.Uint64(b[5:]),
		Delivery:  binary.BigEndian.Uint64(b[13:]),
	}, nil
}

func errCorruptIndex(p uint32, off uint64) error {
	return fmt.Errorf("group index out of step with records at partition %d offset %d", p, off)
}
