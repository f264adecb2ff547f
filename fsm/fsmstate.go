package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/mqd/mqd/internal/durable"
)

// fsm.db is written without fsync (see ARCHITECTURE.md, "Durability
// argument"); the state file next to it, fsm.db.state, says what of it can
// be trusted at the next open. It records whether fsm.db was closed
// cleanly, and the latest checkpoint (checkpoint.go): an applied index
// whose bbolt tree was fsynced and is kept intact on disk, with the bytes
// of its meta page. After a clean close the checkpoint is the closed
// file's last transaction, so the next open can tell that fsm.db is still
// the file it closed; after any other stop the checkpoint's meta page is
// written back and the node replays the raft log after it.
//
// The file is two fixed-size slots, written in turn in place (pwrite and
// fsync, never a new file): a slot torn by a power cut fails its CRC and
// the other, older one is read, and rewriting the file needs no free disk
// space, so a cleanly stopped node starts on a full disk. Each slot:
//
//	magic[8] seq[8] flags[1] pad[15] index[8] term[8] txid[8] meta[80] pagesize[4] crc32c[4]
//
// all integers big endian; the CRC covers the bytes before it.
const (
	fsmStateSuffix = ".state"
	stateSlot      = 512
	stateRecLen    = 144
	stateFlagClean = 1 << 0
	stateFlagCkpt  = 1 << 1
)

var stateMagic = [8]byte{'m', 'q', 'd', 'f', 's', 'm', 's', 1}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fsmState is what the state file records.
type fsmState struct {
	seq   uint64
	clean bool
	ckpt  *checkpoint // nil: none
	// legacy: the file is the text written by an mqd before checkpoints
	// ("clean" or "open <boot id>").
	legacy string
}

func (s *fsmState) encode() []byte {
	b := make([]byte, stateSlot)
	copy(b, stateMagic[:])
	binary.BigEndian.PutUint64(b[8:], s.seq)
	var flags byte
	if s.clean {
		flags |= stateFlagClean
	}
	if c := s.ckpt; c != nil {
		flags |= stateFlagCkpt
		binary.BigEndian.PutUint64(b[32:], c.index)
		binary.BigEndian.PutUint64(b[40:], c.term)
		binary.BigEndian.PutUint64(b[48:], c.txid)
		copy(b[56:56+metaPrefix], c.meta[:])
		binary.BigEndian.PutUint32(b[136:], c.pageSize)
	}
	b[16] = flags
	binary.BigEndian.PutUint32(b[140:], crc32.Checksum(b[:140], castagnoli))
	return b
}

func decodeState(b []byte) (*fsmState, bool) {
	if len(b) < stateRecLen || !bytes.Equal(b[:8], stateMagic[:]) ||
		binary.BigEndian.Uint32(b[140:]) != crc32.Checksum(b[:140], castagnoli) {
		return nil, false
	}
	s := &fsmState{seq: binary.BigEndian.Uint64(b[8:]), clean: b[16]&stateFlagClean != 0}
	if b[16]&stateFlagCkpt != 0 {
		c := &checkpoint{index: binary.BigEndian.Uint64(b[32:]), term: binary.BigEndian.Uint64(b[40:]),
			txid: binary.BigEndian.Uint64(b[48:]), pageSize: binary.BigEndian.Uint32(b[136:])}
		copy(c.meta[:], b[56:56+metaPrefix])
		s.ckpt = c
	}
	return s, true
}

// stateFile is the open state file, rewritten in place.
type stateFile struct {
	f   *os.File
	cur fsmState
}

// readFSMState reads the state file of the fsm.db at path: nil if there
// is none, a state with legacy set for the text of an older mqd, an error
// if neither slot is readable.
func readFSMState(path string) (*fsmState, error) {
	b, err := os.ReadFile(path + fsmStateSuffix)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fsm state: %w", err)
	}
	var best *fsmState
	for off := 0; off+stateRecLen <= len(b); off += stateSlot {
		if s, ok := decodeState(b[off:]); ok && (best == nil || s.seq > best.seq) {
			best = s
		}
	}
	if best != nil {
		return best, nil
	}
	if t := string(bytes.TrimSpace(b)); t == "clean" || bytes.HasPrefix(b, []byte("open ")) {
		return &fsmState{legacy: t}, nil
	}
	return nil, errUnreadableState
}

var errUnreadableState = errors.New("fsm state file unreadable (both records fail their CRC)")

// openStateFile opens the state file for in-place rewrites, creating it
// (temp file, fsync, rename, fsync of the directory) when it is missing or
// not in the two-slot format: the only time it takes new disk space.
func openStateFile(path string, cur *fsmState) (*stateFile, error) {
	name := path + fsmStateSuffix
	if cur == nil || cur.legacy != "" {
		init := fsmState{}
		b := init.encode()
		if err := durable.WriteFileSync(name, append(b, b...)); err != nil {
			return nil, fmt.Errorf("fsm state: %w", err)
		}
		cur = &init
	}
	f, err := os.OpenFile(name, os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("fsm state: %w", err)
	}
	return &stateFile{f: f, cur: *cur}, nil
}

// write records s durably, in the slot the current record is not in.
func (sf *stateFile) write(clean bool, c *checkpoint) error {
	next := fsmState{seq: sf.cur.seq + 1, clean: clean, ckpt: c}
	if _, err := sf.f.WriteAt(next.encode(), int64(next.seq%2)*stateSlot); err != nil {
		return fmt.Errorf("fsm state: %w", err)
	}
	if err := sf.f.Sync(); err != nil {
		return fmt.Errorf("fsm state: sync: %w", err)
	}
	sf.cur = next
	return nil
}

func (sf *stateFile) close() error { return sf.f.Close() }

// readAtFull reads len(b) bytes of name at off.
func readAtFull(name string, b []byte, off int64) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.ReadFull(io.NewSectionReader(f, off, int64(len(b))), b)
	return err
}
