// Package seen remembers, per key, the last value a controller reported,
// so that an event about a lasting state is recorded once per change
// rather than on every reconcile.
package seen

import "sync"

// Set maps keys to the last value reported for them. The zero value is
// ready to use; it is safe for concurrent use.
type Set struct {
	mu sync.Mutex
	m  map[string]string
}

// First records value for key and reports whether it differs from the
// value recorded before (true the first time).
func (s *Set) First(key, value string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]string{}
	}
	if old, ok := s.m[key]; ok && old == value {
		return false
	}
	s.m[key] = value
	return true
}

// Forget drops key, for example once its object is gone.
func (s *Set) Forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}
