package auth

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		glob, name string
		want       bool
	}{
		{"*", "orders", true},
		{"*", "", true},
		{"orders", "orders", true},
		{"orders", "orders2", false},
		{"orders*", "orders", true},
		{"orders*", "orders.eu", true},
		{"orders*", "order", false},
		{"*.eu", "orders.eu", true},
		{"*.eu", "orders.us", false},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"a*b*c", "abcbc", true},
		{"*a*", "bab", true},
		{"**", "x", true},
		{"a*", "ba", false},
	}
	for _, c := range cases {
		if got := Match(c.glob, c.name); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.glob, c.name, got, c.want)
		}
	}
}

func TestParsePermission(t *testing.T) {
	good := map[string]Permission{
		"publish:orders*": {Publish, "orders*"},
		"consume:*":       {Consume, "*"},
		"admin:a.b-c_d":   {Admin, "a.b-c_d"},
		"cluster":         {Cluster, ""},
		"monitor":         {Monitor, ""},
	}
	for s, want := range good {
		got, err := ParsePermission(s)
		if err != nil || got != want {
			t.Errorf("ParsePermission(%q) = %v, %v; want %v", s, got, err, want)
		}
		if got.String() != s {
			t.Errorf("%q round-trips as %q", s, got.String())
		}
	}
	for _, s := range []string{"", "publish", "publish:", "consume:a/b", "cluster:*", "monitor:x", "read:*", "admin:a b", "Publish:*"} {
		if _, err := ParsePermission(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParsePermission(%q) = %v, want ErrInvalid", s, err)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	h := Hash("x")
	bad := map[string]string{
		"unknown field": `{"tokens":[],"extra":1}`,
		"no name":       `{"tokens":[{"sha256":"` + h + `","permissions":[]}]}`,
		"short hash":    `{"tokens":[{"name":"a","sha256":"abcd","permissions":[]}]}`,
		"bad perm":      `{"tokens":[{"name":"a","sha256":"` + h + `","permissions":["write:*"]}]}`,
		"dup name":      `{"tokens":[{"name":"a","sha256":"` + h + `"},{"name":"a","sha256":"` + Hash("y") + `"}]}`,
		"dup hash":      `{"tokens":[{"name":"a","sha256":"` + h + `"},{"name":"b","sha256":"` + h + `"}]}`,
		"not json":      `{"tokens":[`,
		"trailing":      `{"tokens":[]} {}`,
		"token field":   `{"tokens":[{"name":"a","sha256":"` + h + `","token":"x"}]}`,
	}
	for name, data := range bad {
		if _, err := Parse([]byte(data)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Parse = %v, want ErrInvalid", name, err)
		}
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestStoreAuthenticateAndReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	writeFile(t, path, `{"tokens":[{"name":"billing","sha256":"`+Hash("s3cret")+`","permissions":["publish:orders*","consume:orders*"]}]}`)
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	id, ok := s.Authenticate([]byte("s3cret"))
	if !ok || id.Name() != "billing" {
		t.Fatalf("Authenticate(right) = %v, %v", id, ok)
	}
	for _, wrong := range []string{"", "s3cre", "s3cret ", "S3CRET", Hash("s3cret")} {
		if _, ok := s.Authenticate([]byte(wrong)); ok {
			t.Errorf("Authenticate(%q) accepted", wrong)
		}
	}
	checks := []struct {
		need  Perm
		topic string
		want  bool
	}{
		{Publish, "orders", true}, {Publish, "orders.eu", true}, {Publish, "invoices", false},
		{Consume, "orders", true}, {Admin, "orders", false}, {Cluster, "", false}, {Monitor, "", false},
		{Consume | Admin, "orders", true}, {TopicAny, "invoices", false}, {Authenticated, "", true}, {Open, "", true},
	}
	for _, c := range checks {
		if got := id.Allows(c.need, c.topic); got != c.want {
			t.Errorf("Allows(%b, %q) = %v, want %v", c.need, c.topic, got, c.want)
		}
	}

	// A bad file keeps the old tokens.
	writeFile(t, path, `{"tokens":[{"name":"x"}]}`)
	if err := s.Reload(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Reload(bad) = %v, want ErrInvalid", err)
	}
	if _, ok := s.Authenticate([]byte("s3cret")); !ok {
		t.Fatal("a bad file dropped the old tokens")
	}
	// A good file replaces them.
	writeFile(t, path, `{"tokens":[{"name":"ops","sha256":"`+Hash("other")+`","permissions":["monitor"]}]}`)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Authenticate([]byte("s3cret")); ok {
		t.Fatal("revoked token still accepted")
	}
	if id, ok := s.Authenticate([]byte("other")); !ok || !id.Allows(Monitor, "") || id.Allows(Publish, "x") {
		t.Fatalf("new token: %v %v", id, ok)
	}
}

func TestAddToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	s1, err := AddToken(path, "billing", []string{"publish:orders*"})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := AddToken(path, "ops", []string{"monitor"})
	if err != nil {
		t.Fatal(err)
	}
	if s1 == s2 || !strings.HasPrefix(s1, "mqd_") || len(s1) < 40 {
		t.Fatalf("secrets %q %q", s1, s2)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), s1) || strings.Contains(string(data), s2) {
		t.Fatal("the file holds a secret")
	}
	st, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := st.Authenticate([]byte(s1)); !ok || id.Name() != "billing" {
		t.Fatalf("first token: %v %v", id, ok)
	}
	if id, ok := st.Authenticate([]byte(s2)); !ok || id.Name() != "ops" {
		t.Fatalf("second token: %v %v", id, ok)
	}
	if _, err := AddToken(path, "ops", []string{"monitor"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("repeated name: %v", err)
	}
	if _, err := AddToken(path, "x", []string{"bogus"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad permission: %v", err)
	}
	if st2, _ := Load(path); st2.Len() != 2 {
		t.Fatalf("refused adds changed the file: %d tokens", st2.Len())
	}
}

func TestBearerToken(t *testing.T) {
	cases := map[string]string{"Bearer abc": "abc", "bearer abc": "abc", "BEARER  abc ": "abc"}
	for h, want := range cases {
		got, ok := BearerToken([]byte(h))
		if !ok || string(got) != want {
			t.Errorf("BearerToken(%q) = %q, %v", h, got, ok)
		}
	}
	for _, h := range []string{"", "Bearer", "Bearer ", "Basic abc", "abc"} {
		if got, ok := BearerToken([]byte(h)); ok && len(got) > 0 {
			t.Errorf("BearerToken(%q) = %q", h, got)
		}
	}
}

// BenchmarkAuthenticate is the cost a request pays for its token: one
// SHA-256 of the secret, a map lookup, a constant-time compare.
func BenchmarkAuthenticate(b *testing.B) {
	path := filepath.Join(b.TempDir(), "auth.json")
	var f File
	secret := ""
	for i := range 1000 {
		s, err := NewSecret()
		if err != nil {
			b.Fatal(err)
		}
		secret = s
		f.Tokens = append(f.Tokens, TokenEntry{Name: "t" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + itoa(i), SHA256: Hash(s), Permissions: []string{"publish:orders*"}})
	}
	data, _ := json.Marshal(&f)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		b.Fatal(err)
	}
	st, err := Load(path)
	if err != nil {
		b.Fatal(err)
	}
	key := []byte(secret)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		id, ok := st.Authenticate(key)
		if !ok || !id.Allows(Publish, "orders.eu") {
			b.Fatal("refused")
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
