package raftfsm

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateNodeID(t *testing.T) {
	for _, id := range []string{"n1", "mqd-0.mqd.svc", "127.0.0.1:7101", "[::1]:7101", "node_7@rack2", strings.Repeat("a", maxNodeIDLen)} {
		if err := ValidateNodeID(id); err != nil {
			t.Errorf("ValidateNodeID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range []string{"", "a b", "a/b", "a%2Fb", "n1\n", "é", "a?b", "a#b", strings.Repeat("a", maxNodeIDLen+1)} {
		if err := ValidateNodeID(id); !errors.Is(err, ErrInvalidNodeID) {
			t.Errorf("ValidateNodeID(%q) = %v, want ErrInvalidNodeID", id, err)
		}
	}
}
