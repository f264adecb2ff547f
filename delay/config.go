package delay

import (
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// ErrInvalidConfig is wrapped by every Config.Validate error.
var ErrInvalidConfig = errors.New("invalid timing wheel config")

// Defaults and limits of Config.
const (
	DefaultTick   = 10 * time.Millisecond // Config.Tick when zero
	MinTick       = 100 * time.Microsecond
	MaxTick       = 10 * time.Millisecond
	DefaultSlots0 = 256   // level-0 slots when Config.Slots is zero
	DefaultSlotsN = 64    // slots of each higher level when Config.Slots is zero
	MaxSlots      = 65536 // largest Config.Slots
)

// spanBits is how many ticks (as a power of two) the levels span together
// at least; due times further out wait on the overflow list. With the
// defaults that is 2^32 ticks of 10 ms, about 497 days, in five levels.
const spanBits = 32

// Clock tells the time. Tests inject one they advance by hand.
type Clock interface {
	Now() time.Time
}

// RealClock is the system clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// Config configures a Wheel. The zero value is valid and means the defaults.
type Config struct {
	// Tick is the resolution: the span of one level-0 slot, MinTick..MaxTick.
	// Zero means DefaultTick.
	Tick time.Duration
	// Slots is the number of slots of every level, a power of two from 2 to
	// MaxSlots. Zero means DefaultSlots0 at level 0 and DefaultSlotsN above.
	// The number of levels follows: enough to span 2^32 ticks.
	Slots int
	// Clock is read by New, Reset and Run. Nil means RealClock.
	Clock Clock
}

// Validate reports the first field out of range.
func (c Config) Validate() error {
	if c.Tick != 0 && (c.Tick < MinTick || c.Tick > MaxTick) {
		return fmt.Errorf("%w: tick %v must be %v..%v", ErrInvalidConfig, c.Tick, MinTick, MaxTick)
	}
	if c.Slots != 0 && (c.Slots < 2 || c.Slots > MaxSlots || c.Slots&(c.Slots-1) != 0) {
		return fmt.Errorf("%w: slots %d must be a power of two, 2..%d", ErrInvalidConfig, c.Slots, MaxSlots)
	}
	return nil
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.Tick == 0 {
		c.Tick = DefaultTick
	}
	if c.Clock == nil {
		c.Clock = RealClock{}
	}
	return c
}

// levelBits returns log2 of the slot count of each level.
func (c Config) levelBits() []uint {
	b0, bn := uint(bits.TrailingZeros(DefaultSlots0)), uint(bits.TrailingZeros(DefaultSlotsN))
	if c.Slots != 0 {
		b0 = uint(bits.TrailingZeros(uint(c.Slots)))
		bn = b0
	}
	lv := []uint{b0}
	for total := b0; total < spanBits; total += bn {
		lv = append(lv, bn)
	}
	return lv
}
