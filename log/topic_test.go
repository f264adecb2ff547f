package log

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// mustDB opens an initialised bbolt database in a temporary directory.
func mustDB(t testing.TB) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "log.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(Init); err != nil {
		t.Fatal(err)
	}
	return db
}

// mustUpdate runs fn in a write transaction and fails the test on error.
func mustUpdate(t testing.TB, db *bolt.DB, fn func(tx *bolt.Tx) error) {
	t.Helper()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func mustPutTopic(t testing.TB, db *bolt.DB, topic string, p Patch) bool {
	t.Helper()
	var created bool
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		var err error
		created, err = PutTopic(tx, topic, p)
		return err
	})
	return created
}

func mustConfig(t testing.TB, db *bolt.DB, topic string) Config {
	t.Helper()
	var c Config
	if err := db.View(func(tx *bolt.Tx) error {
		var err error
		c, err = GetConfig(tx, topic)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDefaultConfigMatchesSpec(t *testing.T) {
	want := Config{Partitions: 1, MaxRetry: 5, BackoffBaseMs: 1000, BackoffMaxMs: 600000, BackoffJitterMs: 1000,
		AckTimeoutMs: 30000, DedupWindowMs: 604800000, RetentionMs: 0, MaxMessages: 0, MaxBytes: 0,
		Overflow: "reject-publish", MaxMessageBytes: 1048576}
	if got := DefaultConfig(); got != want {
		t.Fatalf("DefaultConfig = %+v, want %+v", got, want)
	}
	if err := want.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestPutTopicCreateThenUpdate(t *testing.T) {
	db := mustDB(t)
	if !mustPutTopic(t, db, "orders", Patch{}) {
		t.Fatalf("first PutTopic: created = false, want true")
	}
	if got := mustConfig(t, db, "orders"); got != DefaultConfig() {
		t.Fatalf("new topic config = %+v, want defaults", got)
	}
	if mustPutTopic(t, db, "orders", Patch{MaxRetry: ptr(int64(2))}) {
		t.Fatalf("second PutTopic: created = true, want false")
	}
	if mustPutTopic(t, db, "orders", Patch{Overflow: ptr(OverflowDropHead)}) {
		t.Fatalf("third PutTopic: created = true")
	}
	want := DefaultConfig()
	want.MaxRetry = 2 // kept from the first update: absent fields keep their value
	want.Overflow = OverflowDropHead
	if got := mustConfig(t, db, "orders"); got != want {
		t.Fatalf("updated config = %+v, want %+v", got, want)
	}
	// Created with fields: defaults plus the patch.
	if !mustPutTopic(t, db, "other", Patch{Partitions: ptr(uint32(3)), RetentionMs: ptr(int64(5000))}) {
		t.Fatalf("other: created = false")
	}
	want = DefaultConfig()
	want.Partitions, want.RetentionMs = 3, 5000
	if got := mustConfig(t, db, "other"); got != want {
		t.Fatalf("other config = %+v, want %+v", got, want)
	}
	_ = db.View(func(tx *bolt.Tx) error {
		if got := Topics(tx); !reflect.DeepEqual(got, []string{"orders", "other"}) {
			t.Errorf("Topics = %v", got)
		}
		return nil
	})
}

func TestPutTopicPartitionsGrowNeverShrink(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{Partitions: ptr(uint32(2))})
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		p, err := OpenPartition(tx, "t", 1)
		if err != nil {
			return err
		}
		_, err = p.Append(&Message{Value: []byte("keep me")})
		return err
	})
	mustPutTopic(t, db, "t", Patch{Partitions: ptr(uint32(5))})
	_ = db.View(func(tx *bolt.Tx) error {
		parts, err := Partitions(tx, "t")
		if err != nil {
			t.Fatal(err)
		}
		if len(parts) != 5 {
			t.Fatalf("partitions = %d, want 5", len(parts))
		}
		if parts[1] != (PartitionMeta{First: 0, Next: 1, Bytes: 7}) {
			t.Errorf("growth touched existing partition 1: %+v", parts[1])
		}
		for _, i := range []int{0, 2, 3, 4} {
			if parts[i] != (PartitionMeta{}) {
				t.Errorf("partition %d = %+v, want empty", i, parts[i])
			}
		}
		return nil
	})
	// Same count is fine; fewer is refused and changes nothing.
	mustPutTopic(t, db, "t", Patch{Partitions: ptr(uint32(5))})
	err := db.Update(func(tx *bolt.Tx) error {
		_, err := PutTopic(tx, "t", Patch{Partitions: ptr(uint32(4)), MaxRetry: ptr(int64(1))})
		return err
	})
	if !errors.Is(err, ErrPartitionShrink) {
		t.Fatalf("shrink: err = %v, want ErrPartitionShrink", err)
	}
	if got := mustConfig(t, db, "t"); got.Partitions != 5 || got.MaxRetry != 5 {
		t.Fatalf("refused shrink changed the config: %+v", got)
	}
}

func TestPutTopicInvalidName(t *testing.T) {
	db := mustDB(t)
	for _, name := range []string{"", ".", "..", strings.Repeat("a", 201), "a/b", "a b", "a\x00b", "tópico", "a\n"} {
		err := db.Update(func(tx *bolt.Tx) error {
			_, err := PutTopic(tx, name, Patch{})
			return err
		})
		if !errors.Is(err, ErrInvalidName) {
			t.Errorf("PutTopic(%q): err = %v, want ErrInvalidName", name, err)
		}
	}
	for _, name := range []string{"a", "...", ".a", "A-Z_0.9", strings.Repeat("z", 200)} {
		if !ValidName(name) {
			t.Errorf("ValidName(%q) = false, want true", name)
		}
	}
	_ = db.View(func(tx *bolt.Tx) error {
		if got := Topics(tx); len(got) != 0 {
			t.Errorf("invalid names created topics %v", got)
		}
		return nil
	})
}

func TestPutTopicInvalidConfig(t *testing.T) {
	db := mustDB(t)
	cases := map[string]Patch{
		"zero partitions":      {Partitions: ptr(uint32(0))},
		"too many partitions":  {Partitions: ptr(uint32(MaxPartitions + 1))},
		"negative max_retry":   {MaxRetry: ptr(int64(-1))},
		"huge max_retry":       {MaxRetry: ptr(int64(1001))},
		"negative backoff":     {BackoffBaseMs: ptr(int64(-1))},
		"negative jitter":      {BackoffJitterMs: ptr(int64(-1))},
		"negative backoff max": {BackoffMaxMs: ptr(int64(-1))},
		"negative dedup":       {DedupWindowMs: ptr(int64(-1))},
		"negative retention":   {RetentionMs: ptr(int64(-1))},
		"zero ack timeout":     {AckTimeoutMs: ptr(int64(0))},
		"negative max_msgs":    {MaxMessages: ptr(int64(-1))},
		"negative max_bytes":   {MaxBytes: ptr(int64(-1))},
		"unknown overflow":     {Overflow: ptr("drop-tail")},
		"zero max msg bytes":   {MaxMessageBytes: ptr(int64(0))},
		"huge max msg bytes":   {MaxMessageBytes: ptr(int64(MaxMessageBytesCap + 1))},
	}
	for name, p := range cases {
		err := db.Update(func(tx *bolt.Tx) error {
			_, err := PutTopic(tx, "t", p)
			return err
		})
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	// An invalid update of an existing topic changes nothing.
	mustPutTopic(t, db, "t", Patch{})
	err := db.Update(func(tx *bolt.Tx) error {
		_, err := PutTopic(tx, "t", Patch{MaxRetry: ptr(int64(1)), Overflow: ptr("nope")})
		return err
	})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("invalid update: err = %v", err)
	}
	if got := mustConfig(t, db, "t"); got != DefaultConfig() {
		t.Fatalf("invalid update changed config to %+v", got)
	}
}

func TestDeleteTopic(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "a", Patch{})
	mustPutTopic(t, db, "b", Patch{})
	mustUpdate(t, db, func(tx *bolt.Tx) error { return DeleteTopic(tx, "a") })
	_ = db.View(func(tx *bolt.Tx) error {
		if got := Topics(tx); !reflect.DeepEqual(got, []string{"b"}) {
			t.Errorf("Topics after delete = %v", got)
		}
		if _, err := GetConfig(tx, "a"); !errors.Is(err, ErrTopicNotFound) {
			t.Errorf("GetConfig(deleted): err = %v", err)
		}
		if _, err := Open(tx, "a"); !errors.Is(err, ErrTopicNotFound) {
			t.Errorf("Open(deleted): err = %v", err)
		}
		if _, err := Partitions(tx, "a"); !errors.Is(err, ErrTopicNotFound) {
			t.Errorf("Partitions(deleted): err = %v", err)
		}
		return nil
	})
	err := db.Update(func(tx *bolt.Tx) error { return DeleteTopic(tx, "a") })
	if !errors.Is(err, ErrTopicNotFound) {
		t.Fatalf("second delete: err = %v, want ErrTopicNotFound", err)
	}
	// A re-created topic starts from scratch.
	if !mustPutTopic(t, db, "a", Patch{}) {
		t.Fatalf("re-create: created = false")
	}
}
