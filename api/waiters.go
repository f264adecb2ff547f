package api

import "sync"

// waiters wakes long-polling fetches when their topic may have something
// to deliver. It holds one channel per topic with waiters, never per
// message.
type waiters struct {
	mu     sync.Mutex
	ch     map[string]chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newWaiters() *waiters {
	return &waiters{ch: map[string]chan struct{}{}, closed: make(chan struct{})}
}

// wait returns a channel closed at the topic's next wake-up.
func (w *waiters) wait(topic string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, ok := w.ch[topic]
	if !ok {
		c = make(chan struct{})
		w.ch[topic] = c
	}
	return c
}

// wake wakes every waiter of the given topics.
func (w *waiters) wake(topics map[string]struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for t := range topics {
		if c, ok := w.ch[t]; ok {
			close(c)
			delete(w.ch, t)
		}
	}
}

// closeAll ends every wait, for shutdown.
func (w *waiters) closeAll() { w.once.Do(func() { close(w.closed) }) }
