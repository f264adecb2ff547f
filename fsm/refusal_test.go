package fsm

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mqd/mqd/internal/refusal"
)

// Every refusal any package declares is a command's answer, never a reason
// to stop the node (a refusal the FSM did not know would panic every
// replica at the same index); anything else still stops it.
func TestEveryRefusalIsBusiness(t *testing.T) {
	all := refusal.All()
	if len(all) < 10 {
		t.Fatalf("only %d refusals registered: %v", len(all), all)
	}
	for _, r := range all {
		if !isBusiness(fmt.Errorf("apply: %w", r)) {
			t.Errorf("refusal %s (%d) would stop the node", r.Code, r.Status)
		}
	}
	if isBusiness(errors.New("bolt: page corrupt")) {
		t.Error("a storage failure counts as a refusal")
	}
}
