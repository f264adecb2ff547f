package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
)

// TokenEntry is one token of the file: its name (for logs and limits),
// the hex SHA-256 of its secret, and its permissions.
type TokenEntry struct {
	Name        string   `json:"name"`
	SHA256      string   `json:"sha256"`
	Permissions []string `json:"permissions"`
}

// File is the JSON of --auth-file.
type File struct {
	Tokens []TokenEntry `json:"tokens"`
}

// Identity is a known token: its name and what it may do.
type Identity struct {
	name  string
	sum   [sha256.Size]byte
	perms []Permission
}

// Name is the token's name from the file (never its secret).
func (id *Identity) Name() string { return id.name }

// Allows reports whether the token holds one of the kinds in need; topic
// kinds count only when their glob matches topic. Authenticated is allowed
// to every token, Open to everyone.
func (id *Identity) Allows(need Perm, topic string) bool {
	if need == Open || need == Authenticated {
		return true
	}
	for _, p := range id.perms {
		if p.Kind&need == 0 {
			continue
		}
		if p.Kind&TopicAny == 0 || Match(p.Glob, topic) {
			return true
		}
	}
	return false
}

// Sees reports whether the token holds any permission on topic (what GET
// of a topic and the topic list need).
func (id *Identity) Sees(topic string) bool { return id.Allows(TopicAny, topic) }

// table is one loaded token file, looked up by the hash of the secret.
type table map[[sha256.Size]byte]*Identity

// Hash is the hex SHA-256 of a secret, as the token file stores it.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Parse reads and validates a token file's JSON: unknown fields, empty or
// repeated names, malformed or repeated hashes and unknown permissions are
// refused.
func Parse(data []byte) (*File, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrInvalid)
	}
	if _, err := f.table(); err != nil {
		return nil, err
	}
	return &f, nil
}

func (f *File) table() (table, error) {
	t := table{}
	names := map[string]bool{}
	for i, e := range f.Tokens {
		if e.Name == "" {
			return nil, fmt.Errorf("%w: token %d has no name", ErrInvalid, i+1)
		}
		if names[e.Name] {
			return nil, fmt.Errorf("%w: token name %q appears twice", ErrInvalid, e.Name)
		}
		names[e.Name] = true
		raw, err := hex.DecodeString(e.SHA256)
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("%w: token %q: sha256 must be 64 hex digits", ErrInvalid, e.Name)
		}
		id := &Identity{name: e.Name}
		copy(id.sum[:], raw)
		if _, dup := t[id.sum]; dup {
			return nil, fmt.Errorf("%w: token %q has the same hash as another token", ErrInvalid, e.Name)
		}
		for _, ps := range e.Permissions {
			p, err := ParsePermission(ps)
			if err != nil {
				return nil, fmt.Errorf("token %q: %w", e.Name, err)
			}
			id.perms = append(id.perms, p)
		}
		t[id.sum] = id
	}
	return t, nil
}

// Store holds the tokens of one file; Reload swaps them atomically.
type Store struct {
	path string
	cur  atomic.Pointer[table]
}

// Load reads the token file at path.
func Load(path string) (*Store, error) {
	s := &Store{path: path}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload re-reads the file. On error the tokens loaded before stay in force.
func (s *Store) Reload() error {
	data, err := os.ReadFile(s.path)
	if err != nil {
		return fmt.Errorf("auth file: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return fmt.Errorf("auth file %s: %w", s.path, err)
	}
	t, _ := f.table()
	s.cur.Store(&t)
	return nil
}

// Len is the number of tokens in force.
func (s *Store) Len() int { return len(*s.cur.Load()) }

// Authenticate finds the token whose secret is secret: it hashes the
// secret, looks the hash up, and compares the hashes in constant time.
func (s *Store) Authenticate(secret []byte) (*Identity, bool) {
	if len(secret) == 0 {
		return nil, false
	}
	sum := sha256.Sum256(secret)
	id, ok := (*s.cur.Load())[sum]
	if !ok || subtle.ConstantTimeCompare(id.sum[:], sum[:]) != 1 {
		return nil, false
	}
	return id, true
}

// BearerToken extracts the token of an "Authorization: Bearer <token>"
// header value; ok is false when the header is missing or of another scheme.
func BearerToken(header []byte) ([]byte, bool) {
	const prefix = "bearer "
	if len(header) <= len(prefix) || !strings.EqualFold(string(header[:len(prefix)]), prefix) {
		return nil, false
	}
	return bytes.TrimSpace(header[len(prefix):]), true
}

// NewSecret draws a new token secret: "mqd_" and 32 random bytes in
// URL-safe base64.
func NewSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	return "mqd_" + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// AddToken adds a token named name with perms to the file at path
// (creating it, mode 0600) and returns its secret, which is stored nowhere.
// The file is replaced atomically (write, fsync, rename).
func AddToken(path, name string, perms []string) (string, error) {
	f := &File{}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if f, err = Parse(data); err != nil {
			return "", err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("auth file: %w", err)
	}
	for _, e := range f.Tokens {
		if e.Name == name {
			return "", fmt.Errorf("%w: a token named %q exists already", ErrInvalid, name)
		}
	}
	secret, err := NewSecret()
	if err != nil {
		return "", err
	}
	f.Tokens = append(f.Tokens, TokenEntry{Name: name, SHA256: Hash(secret), Permissions: perms})
	if _, err := f.table(); err != nil {
		return "", err
	}
	out, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return "", err
	}
	if err := writeFileAtomic(path, append(out, '\n')); err != nil {
		return "", err
	}
	return secret, nil
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".auth-*.tmp")
	if err != nil {
		return fmt.Errorf("auth file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("auth file: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("auth file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("auth file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("auth file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("auth file: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
