package dlq

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// TestStoreAgainstModel runs random sequences of adds, replay requests,
// replay steps and deletes, and checks the store against a simple model:
// the set of letters, and which of them are queued for replay.
func TestStoreAgainstModel(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		mustStore(t, func(s *Store) {
			letters := map[uint64]bool{} // id → queued
			next := uint64(1)
			for step := 0; step < 60; step++ {
				op := rng.IntN(5)
				switch op {
				case 0, 1:
					id, err := s.Add(letter(int(next), "k"))
					if err != nil || id != next {
						t.Fatalf("seed %d: Add = %d, %v", seed, id, err)
					}
					letters[id] = false
					next++
				case 2:
					if rng.IntN(3) == 0 {
						want := uint64(0)
						for id, q := range letters {
							if !q {
								letters[id] = true
								want++
							}
						}
						if n, err := s.QueueReplay(nil, true, 5); err != nil || n != want {
							t.Fatalf("seed %d step %d: QueueReplay(all) = %d, %v; want %d", seed, step, n, err, want)
						}
						continue
					}
					ids := []uint64{uint64(rng.IntN(int(next) + 1)), uint64(rng.IntN(int(next) + 1))}
					want := uint64(0)
					for _, id := range ids {
						if q, ok := letters[id]; ok && !q {
							letters[id] = true
							want++
						}
					}
					if n, err := s.QueueReplay(ids, false, 5); err != nil || n != want {
						t.Fatalf("seed %d step %d: QueueReplay(%v) = %d, %v; want %d", seed, step, ids, n, err, want)
					}
				case 3:
					ls, err := s.NextReplay(1 + rng.IntN(3))
					if err != nil {
						t.Fatalf("seed %d step %d: NextReplay: %v", seed, step, err)
					}
					for _, l := range ls {
						if q, ok := letters[l.ID]; !ok || !q {
							t.Fatalf("seed %d step %d: replayed %d, which was not queued", seed, step, l.ID)
						}
						delete(letters, l.ID)
					}
				case 4:
					id := uint64(rng.IntN(int(next) + 1))
					_, err := s.Delete(id)
					if _, ok := letters[id]; ok != (err == nil) || (err != nil && !errors.Is(err, ErrNotFound)) {
						t.Fatalf("seed %d step %d: Delete(%d) = %v, exists %v", seed, step, id, err, ok)
					}
					delete(letters, id)
				}
				var queued uint64
				for _, q := range letters {
					if q {
						queued++
					}
				}
				if s.ReplayPending() != queued || s.Count() != uint64(len(letters)) {
					t.Fatalf("seed %d step %d: pending %d count %d, model %d and %d", seed, step, s.ReplayPending(), s.Count(), queued, len(letters))
				}
			}
		})
	}
}
