package fsm

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
)

// A batch the state file cannot take stops the process with status 1
// (after a log line) rather than skipping it or panicking first.
func TestStorageErrorStops(t *testing.T) {
	h := mustFSM(t)
	code := -1
	exit = func(c int) { code = c; panic(errStopped) }
	defer func() { exit = osExit }()
	h.f.stopCheckpoints()
	h.f.releasePin()
	h.f.db.Close() // every write now fails
	func() {
		defer func() {
			if r := recover(); r != errStopped {
				t.Fatalf("recovered %v, want the stop", r)
			}
		}()
		h.f.ApplyBatch([]*raft.Log{{Index: 1, Type: raft.LogCommand, Data: (&command.Command{Op: command.OpPutTopic, Topic: "t"}).Encode()}})
	}()
	if code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
}

var errStopped = errors.New("stopped")
