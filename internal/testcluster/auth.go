package testcluster

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TokenFile is the JSON of a node's --auth-file, as docs/security.md
// defines it (written here from the documented format, not with the
// broker's own package).
type TokenFile struct {
	Tokens []TokenEntry `json:"tokens"`
}

// TokenEntry is one token of a TokenFile: its name, the SHA-256 of its
// secret in hex, and its permissions.
type TokenEntry struct {
	Name        string   `json:"name"`
	SHA256      string   `json:"sha256"`
	Permissions []string `json:"permissions"`
}

// AuthFixture is a token file under the test's temporary directory with
// one token per name, and the tokens' secrets.
type AuthFixture struct {
	Path    string
	Secrets map[string]string // token name → secret
}

// AuthTokens writes a token file holding a new token for each name of
// perms, with those permissions.
func AuthTokens(t testing.TB, perms map[string][]string) *AuthFixture {
	t.Helper()
	fx := &AuthFixture{Path: filepath.Join(t.TempDir(), "auth.json"), Secrets: map[string]string{}}
	var f TokenFile
	for name, ps := range perms {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		secret := "mqd_" + base64.RawURLEncoding.EncodeToString(b[:])
		sum := sha256.Sum256([]byte(secret))
		fx.Secrets[name] = secret
		f.Tokens = append(f.Tokens, TokenEntry{Name: name, SHA256: hex.EncodeToString(sum[:]), Permissions: ps})
	}
	fx.Write(t, &f)
	return fx
}

// Write replaces the fixture's file with f (a node rereads it on SIGHUP).
func (fx *AuthFixture) Write(t testing.TB, f *TokenFile) {
	t.Helper()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fx.Path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// StartAuth starts n nodes with --auth-file fx.Path; the harness's client
// uses fx's "ops" token and the nodes authenticate to each other with its
// "node" token (MQD_NODE_TOKEN).
func StartAuth(t testing.TB, n int, fx *AuthFixture, opts ...Option) *Cluster {
	t.Helper()
	cl := NewClient(15*time.Second, 16).WithToken(fx.Secrets["ops"])
	opts = append([]Option{WithFlags("--auth-file", fx.Path), WithEnv("MQD_NODE_TOKEN=" + fx.Secrets["node"]),
		WithClient(cl)}, opts...)
	return Start(t, n, opts...)
}
