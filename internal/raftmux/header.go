package raftmux

import (
	"errors"
	"fmt"
	"io"
)

// A connection's first byte says which group it is for. hashicorp/raft's
// NetworkTransport starts every RPC with its type (net_transport.go:
// rpcAppendEntries = 0 up to rpcRequestPreVote = 4), so a connection from
// a node that knows no groups starts with a small value: every byte below
// groupMarker goes to the default group, put back for raft to read. A
// connection for another group starts with groupMarker, one length byte
// and the group's id; raft's own RPCs follow. groupMarker sits far above
// any rpc type raft may add, so an old node's connection is never taken
// for a tagged one.
const (
	groupMarker byte = 0x80
	// MaxGroupLen bounds a group id, so a header is at most 66 bytes and
	// a peer cannot make the mux read more before it knows the group.
	MaxGroupLen = 64
)

// Default is the group untagged connections belong to: the one every node
// of the previous release ran. Its own dials stay untagged, so those
// nodes understand them.
const Default = ""

// ErrMalformed is a connection whose first bytes are neither a raft RPC
// nor a valid group header.
var ErrMalformed = errors.New("malformed raft connection header")

// ErrUnknownGroup is a connection for a group this node does not run.
var ErrUnknownGroup = errors.New("no such raft group on this node")

// ErrInvalidGroup is a group id the header cannot carry.
var ErrInvalidGroup = errors.New("invalid raft group id")

// ValidGroup checks a group id: 1 to MaxGroupLen bytes of ASCII letters,
// digits, '.', '_' or '-' (Default, the empty id, is never sent).
func ValidGroup(id string) error {
	if len(id) == 0 || len(id) > MaxGroupLen {
		return fmt.Errorf("%w: %q: 1 to %d bytes", ErrInvalidGroup, id, MaxGroupLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q: byte %d is not a letter, digit, '.', '_' or '-'", ErrInvalidGroup, id, i)
		}
	}
	return nil
}

// appendHeader appends the header that tags a connection for group
// (already validated, not Default).
func appendHeader(dst []byte, group string) []byte {
	dst = append(dst, groupMarker, byte(len(group)))
	return append(dst, group...)
}

// readHeader reads a connection's group. For an untagged connection it
// answers Default and the byte it read, which belongs to raft; for a
// tagged one the bytes read were all header. It reads exactly the
// header's bytes, so nothing of the RPC behind it is consumed.
func readHeader(r io.Reader) (group string, first []byte, err error) {
	var b [1 + MaxGroupLen]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return "", nil, fmt.Errorf("%w: reading the first byte: %w", ErrMalformed, err)
	}
	switch {
	case b[0] < groupMarker:
		return Default, []byte{b[0]}, nil
	case b[0] != groupMarker:
		return "", nil, fmt.Errorf("%w: first byte 0x%02x is neither a raft rpc type nor a group header", ErrMalformed, b[0])
	}
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return "", nil, fmt.Errorf("%w: reading the group id's length: %w", ErrMalformed, err)
	}
	n := int(b[0])
	if n == 0 || n > MaxGroupLen {
		return "", nil, fmt.Errorf("%w: group id of %d bytes (1 to %d)", ErrMalformed, n, MaxGroupLen)
	}
	if _, err := io.ReadFull(r, b[:n]); err != nil {
		return "", nil, fmt.Errorf("%w: reading the group id: %w", ErrMalformed, err)
	}
	group = string(b[:n])
	if err := ValidGroup(group); err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return group, nil, nil
}
