package seen

import "testing"

func TestFirst(t *testing.T) {
	var s Set
	steps := []struct {
		key, value string
		forget     bool
		want       bool
	}{
		{"pod-a", "token-1", false, true},
		{"pod-a", "token-1", false, false},
		{"pod-b", "token-1", false, true},
		{"pod-a", "token-2", false, true},
		{"pod-a", "token-2", true, false},
		{"pod-a", "token-2", false, true},
	}
	for i, st := range steps {
		if got := s.First(st.key, st.value); got != st.want {
			t.Fatalf("step %d: First(%q, %q) = %v, want %v", i, st.key, st.value, got, st.want)
		}
		if st.forget {
			s.Forget(st.key)
		}
	}
}
