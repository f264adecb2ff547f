package client

import (
	"os"
	"strings"
)

// BreakEnv names the environment variable that switches rules of this
// client off, for the conformance suite's self-test only: each case of the
// suite (clients/conformance/cases.json) must fail against a client with
// the rule it checks broken. The Python, Node.js and Java clients read the
// same variable with the same rule names. Never set it otherwise.
const BreakEnv = "MQD_CLIENT_BREAK"

// Rules that BreakEnv can switch off (comma-separated).
const (
	breakNoRetry          = "no_retry"             // retry nothing
	breakRetry4xx         = "retry_4xx"            // retry 4xx answers too
	breakRetryUnkeyed     = "retry_unkeyed"        // resend a publish without a key after a lost answer
	breakNewKey           = "new_key_on_retry"     // a fresh Idempotency-Key on every attempt
	breakNoFailover       = "no_failover"          // stay on the first server
	breakIgnoreRetryAfter = "ignore_retry_after"   // pause only the backoff
	breakTimeoutNoWait    = "timeout_ignores_wait" // a fetch's HTTP timeout does not add wait_ms
	breakNoExtend         = "no_extend"            // the consumer never extends a lease
	breakNackNoReason     = "nack_no_reason"       // the consumer nacks without the handler's error
	breakHideStale        = "hide_stale"           // a stale receipt is reported as ok
	breakPublishThenAck   = "publish_then_ack"     // ConsumeProcess publishes its outputs, then acks: two calls
)

var breaks = parseBreaks(os.Getenv(BreakEnv))

func parseBreaks(s string) map[string]bool {
	m := map[string]bool{}
	for _, r := range strings.Split(s, ",") {
		if r = strings.TrimSpace(r); r != "" {
			m[r] = true
		}
	}
	return m
}

func broken(rule string) bool { return breaks[rule] }
