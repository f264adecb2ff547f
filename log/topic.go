package log

import (
	"errors"
	"fmt"

	"github.com/mqd/mqd/internal/refusal"
	bolt "go.etcd.io/bbolt"
)

// Sentinel errors of the log. Callers check them with errors.Is.
var (
	ErrTopicNotFound   = refusal.New(404, "topic_not_found", "topic not found")
	ErrTopicFull       = refusal.New(507, "topic_full", "topic full")
	ErrPartitionShrink = refusal.New(409, "partitions_shrink", "partitions cannot shrink")
	ErrInvalidConfig   = refusal.New(400, "invalid_config", "invalid topic config")
	ErrInvalidName     = refusal.New(400, "invalid_name", "invalid name")
	ErrTooLarge        = refusal.New(413, "message_too_large", "message too large")
)

// Overflow policies.
const (
	OverflowReject   = "reject-publish"
	OverflowDropHead = "drop-head"
)

// Limits on configuration values.
const (
	MaxPartitions      = 1024
	MaxMessageBytesCap = 16 << 20
	maxDurationMs      = 100 * 365 * 24 * 3600 * 1000 // a century
)

// Config is a topic's configuration. Durations are in milliseconds.
type Config struct {
	Partitions      uint32 `json:"partitions"`
	MaxRetry        int64  `json:"max_retry"`
	BackoffBaseMs   int64  `json:"backoff_base_ms"`
	BackoffMaxMs    int64  `json:"backoff_max_ms"`
	BackoffJitterMs int64  `json:"backoff_jitter_ms"`
	AckTimeoutMs    int64  `json:"ack_timeout_ms"`
	DedupWindowMs   int64  `json:"dedup_window_ms"`
	RetentionMs     int64  `json:"retention_ms"`
	MaxMessages     int64  `json:"max_messages"`
	MaxBytes        int64  `json:"max_bytes"`
	Overflow        string `json:"overflow"`
	MaxMessageBytes int64  `json:"max_message_bytes"`
}

// DefaultConfig returns the defaults of SPEC section 3.
func DefaultConfig() Config {
	return Config{
		Partitions:      1,
		MaxRetry:        5,
		BackoffBaseMs:   1000,
		BackoffMaxMs:    600000,
		BackoffJitterMs: 1000,
		AckTimeoutMs:    30000,
		DedupWindowMs:   604800000,
		Overflow:        OverflowReject,
		MaxMessageBytes: 1 << 20,
	}
}

// Validate reports the first out-of-range field.
func (c Config) Validate() error {
	bad := func(f string, why string) error { return fmt.Errorf("%w: %s %s", ErrInvalidConfig, f, why) }
	if c.Partitions < 1 || c.Partitions > MaxPartitions {
		return bad("partitions", fmt.Sprintf("must be 1..%d", MaxPartitions))
	}
	if c.MaxRetry < 0 || c.MaxRetry > 1000 {
		return bad("max_retry", "must be 0..1000")
	}
	for _, d := range []struct {
		name string
		v    int64
	}{{"backoff_base_ms", c.BackoffBaseMs}, {"backoff_max_ms", c.BackoffMaxMs}, {"backoff_jitter_ms", c.BackoffJitterMs},
		{"dedup_window_ms", c.DedupWindowMs}, {"retention_ms", c.RetentionMs}} {
		if d.v < 0 || d.v > maxDurationMs {
			return bad(d.name, "must be a non-negative duration of at most 100 years")
		}
	}
	if c.AckTimeoutMs < 1 || c.AckTimeoutMs > 12*3600*1000 {
		return bad("ack_timeout_ms", "must be 1..43200000 (12 h)")
	}
	if c.MaxMessages < 0 || c.MaxBytes < 0 {
		return bad("max_messages/max_bytes", "must not be negative")
	}
	if c.Overflow != OverflowReject && c.Overflow != OverflowDropHead {
		return bad("overflow", `must be "reject-publish" or "drop-head"`)
	}
	if c.MaxMessageBytes < 1 || c.MaxMessageBytes > MaxMessageBytesCap {
		return bad("max_message_bytes", fmt.Sprintf("must be 1..%d", MaxMessageBytesCap))
	}
	return nil
}

// CheckSize reports ErrTooLarge for a payload over max_message_bytes.
func (c Config) CheckSize(n int) error {
	if int64(n) > c.MaxMessageBytes {
		return fmt.Errorf("%w: %d bytes > max_message_bytes %d", ErrTooLarge, n, c.MaxMessageBytes)
	}
	return nil
}

// Patch holds the fields of a topic update that were present in the request.
type Patch struct {
	Partitions      *uint32
	MaxRetry        *int64
	BackoffBaseMs   *int64
	BackoffMaxMs    *int64
	BackoffJitterMs *int64
	AckTimeoutMs    *int64
	DedupWindowMs   *int64
	RetentionMs     *int64
	MaxMessages     *int64
	MaxBytes        *int64
	Overflow        *string
	MaxMessageBytes *int64
}

// int64Fields lists the patch's int64 fields with the config fields they set,
// in a fixed order (the codec depends on it).
func (p *Patch) int64Fields(c *Config) []struct {
	src **int64
	dst *int64
} {
	return []struct {
		src **int64
		dst *int64
	}{
		{&p.MaxRetry, &c.MaxRetry}, {&p.BackoffBaseMs, &c.BackoffBaseMs}, {&p.BackoffMaxMs, &c.BackoffMaxMs},
		{&p.BackoffJitterMs, &c.BackoffJitterMs}, {&p.AckTimeoutMs, &c.AckTimeoutMs}, {&p.DedupWindowMs, &c.DedupWindowMs},
		{&p.RetentionMs, &c.RetentionMs}, {&p.MaxMessages, &c.MaxMessages}, {&p.MaxBytes, &c.MaxBytes},
		{&p.MaxMessageBytes, &c.MaxMessageBytes},
	}
}

// Apply returns c with the patch's present fields replaced.
func (p *Patch) Apply(c Config) Config {
	if p.Partitions != nil {
		c.Partitions = *p.Partitions
	}
	if p.Overflow != nil {
		c.Overflow = *p.Overflow
	}
	for _, f := range p.int64Fields(&c) {
		if *f.src != nil {
			*f.dst = **f.src
		}
	}
	return c
}

// Encode appends the patch to e: a presence bitmap, then the present values.
func (p *Patch) Encode(e *Enc) {
	var mask uint64
	var c Config
	fields := p.int64Fields(&c)
	for i, f := range fields {
		if *f.src != nil {
			mask |= 1 << i
		}
	}
	if p.Partitions != nil {
		mask |= 1 << 20
	}
	if p.Overflow != nil {
		mask |= 1 << 21
	}
	e.U64(mask)
	for _, f := range fields {
		if *f.src != nil {
			e.I64(**f.src)
		}
	}
	if p.Partitions != nil {
		e.U64(uint64(*p.Partitions))
	}
	if p.Overflow != nil {
		e.Str(*p.Overflow)
	}
}

// DecodePatch reads what Patch.Encode wrote.
func DecodePatch(d *Dec) Patch {
	var p Patch
	var c Config
	mask := d.U64()
	for i, f := range p.int64Fields(&c) {
		if mask&(1<<i) != 0 {
			v := d.I64()
			*f.src = &v
		}
	}
	if mask&(1<<20) != 0 {
		v := uint32(d.U64())
		p.Partitions = &v
	}
	if mask&(1<<21) != 0 {
		v := d.Str()
		p.Overflow = &v
	}
	return p
}

func encodeConfig(c Config) []byte {
	var e Enc
	e.Byte(1) // record version
	e.U64(uint64(c.Partitions))
	for _, v := range []int64{c.MaxRetry, c.BackoffBaseMs, c.BackoffMaxMs, c.BackoffJitterMs, c.AckTimeoutMs,
		c.DedupWindowMs, c.RetentionMs, c.MaxMessages, c.MaxBytes, c.MaxMessageBytes} {
		e.I64(v)
	}
	e.Str(c.Overflow)
	return e.B
}

func decodeConfig(b []byte) (Config, error) {
	d := Dec{B: b}
	var c Config
	if v := d.Byte(); v != 1 {
		return c, fmt.Errorf("%w: config version %d", ErrCorrupt, v)
	}
	c.Partitions = uint32(d.U64())
	for _, p := range []*int64{&c.MaxRetry, &c.BackoffBaseMs, &c.BackoffMaxMs, &c.BackoffJitterMs, &c.AckTimeoutMs,
		&c.DedupWindowMs, &c.RetentionMs, &c.MaxMessages, &c.MaxBytes, &c.MaxMessageBytes} {
		*p = d.I64()
	}
	c.Overflow = d.Str()
	return c, d.Err()
}

// ValidName reports whether s is a valid topic or group name:
// [A-Za-z0-9._-]{1,200}, and not . or .. (a loop, not a regexp: every
// request with a topic in its path asks).
func ValidName(s string) bool {
	if len(s) < 1 || len(s) > 200 || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

var (
	bktTopics = []byte("topics")
	keyCfg    = []byte("cfg")
	bktParts  = []byte("p")
	bktMsgs   = []byte("m")
	keyMeta   = []byte("meta")
	// BucketGroups is the name of the sub-bucket of a topic's bucket that the
	// consumer-group package owns.
	BucketGroups = []byte("g")
)

// Init creates the log's root buckets.
func Init(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(bktTopics)
	return err
}

// TopicBucket returns a topic's bucket, or ErrTopicNotFound.
func TopicBucket(tx *bolt.Tx, topic string) (*bolt.Bucket, error) {
	b := tx.Bucket(bktTopics).Bucket([]byte(topic))
	if b == nil {
		return nil, fmt.Errorf("%w: %q", ErrTopicNotFound, topic)
	}
	return b, nil
}

// GetConfig returns a topic's configuration.
func GetConfig(tx *bolt.Tx, topic string) (Config, error) {
	b, err := TopicBucket(tx, topic)
	if err != nil {
		return Config{}, err
	}
	return decodeConfig(b.Get(keyCfg))
}

// PutTopic creates a topic (with the defaults and p applied) or updates it.
// It reports whether the topic was created.
func PutTopic(tx *bolt.Tx, topic string, p Patch) (created bool, err error) {
	if !ValidName(topic) {
		return false, fmt.Errorf("%w: %q", ErrInvalidName, topic)
	}
	root := tx.Bucket(bktTopics)
	b := root.Bucket([]byte(topic))
	cur := DefaultConfig()
	if b != nil {
		if cur, err = decodeConfig(b.Get(keyCfg)); err != nil {
			return false, err
		}
	}
	next := p.Apply(cur)
	if err := next.Validate(); err != nil {
		return false, err
	}
	if b != nil && next.Partitions < cur.Partitions {
		return false, fmt.Errorf("%w: %d < %d", ErrPartitionShrink, next.Partitions, cur.Partitions)
	}
	if b == nil {
		created = true
		if b, err = root.CreateBucket([]byte(topic)); err != nil {
			return false, fmt.Errorf("create topic: %w", err)
		}
		if _, err = b.CreateBucket(BucketGroups); err != nil {
			return false, err
		}
		if _, err = b.CreateBucket(bktParts); err != nil {
			return false, err
		}
	}
	if err := ensurePartitions(b.Bucket(bktParts), next.Partitions); err != nil {
		return false, err
	}
	return created, b.Put(keyCfg, encodeConfig(next))
}

// DeleteTopic removes a topic with all its data.
func DeleteTopic(tx *bolt.Tx, topic string) error {
	err := tx.Bucket(bktTopics).DeleteBucket([]byte(topic))
	if errors.Is(err, bolt.ErrBucketNotFound) {
		return fmt.Errorf("%w: %q", ErrTopicNotFound, topic)
	}
	return err
}

// Topics returns every topic name in order.
// EachTopicAfter calls fn with each topic name that sorts after after, in
// order, until fn answers false: a page of topics costs a seek, not a walk
// over all of them.
func EachTopicAfter(tx *bolt.Tx, after string, fn func(name string) bool) {
	c := tx.Bucket(bktTopics).Cursor()
	k, v := c.Seek([]byte(after))
	if k != nil && string(k) == after {
		k, v = c.Next()
	}
	for ; k != nil; k, v = c.Next() {
		if v != nil { // not a topic bucket
			continue
		}
		if !fn(string(k)) {
			return
		}
	}
}

func Topics(tx *bolt.Tx) []string {
	var names []string
	_ = tx.Bucket(bktTopics).ForEachBucket(func(k []byte) error {
		names = append(names, string(k))
		return nil
	})
	return names
}
