package log

import (
	"regexp"
	"strings"
	"testing"
)

// ValidName is a loop; it must accept exactly what the contract's pattern
// does: every string of up to 3 bytes over an alphabet with each class of
// byte, and lengths around the 200-byte limit.
func TestValidNameMatchesPattern(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)
	want := func(s string) bool { return s != "." && s != ".." && re.MatchString(s) }
	alphabet := []string{"", "a", "Z", "0", "9", ".", "_", "-", "/", " ", "\x00", "\xff", "é", "@", "[", "`", "{"}
	for _, a := range alphabet {
		for _, b := range alphabet {
			for _, c := range alphabet {
				if s := a + b + c; ValidName(s) != want(s) {
					t.Errorf("ValidName(%q) = %v, want %v", s, ValidName(s), want(s))
				}
			}
		}
	}
	for _, n := range []int{199, 200, 201, 400} {
		for _, s := range []string{strings.Repeat("a", n), strings.Repeat(".", n), strings.Repeat("a", n-1) + "/"} {
			if ValidName(s) != want(s) {
				t.Errorf("ValidName(%d bytes %q...) = %v, want %v", n, s[:3], ValidName(s), want(s))
			}
		}
	}
}
