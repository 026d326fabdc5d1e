package history

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	g := func(key, holder string, from, to int, token int64) Grant {
		return Grant{Key: key, Holder: holder, Start: at(from), End: at(to), Token: token}
	}
	sem := func(slots, slot int, holder string, from, to int) Grant {
		return Grant{Key: fmt.Sprintf("s:slot:%d", slot), Semaphore: "s", Slots: slots, Holder: holder, Start: at(from), End: at(to)}
	}
	tests := []struct {
		name   string
		grants []Grant
		want   string // substring of the error; "" means no violation
	}{
		{"empty", nil, ""},
		{"sequential", []Grant{g("k", "a", 0, 10, 1), g("k", "b", 10, 20, 2), g("k", "c", 25, 30, 3)}, ""},
		{"unordered input", []Grant{g("k", "c", 25, 30, 0), g("k", "a", 0, 10, 0), g("k", "b", 12, 20, 0)}, ""},
		{"different keys may overlap", []Grant{g("k1", "a", 0, 10, 1), g("k2", "b", 5, 15, 1)}, ""},
		{"overlap", []Grant{g("k", "a", 0, 10, 0), g("k", "b", 9, 20, 0)}, "overlap 1ms"},
		{"contained in a long earlier grant", []Grant{g("k", "a", 0, 100, 0), g("k", "b", 10, 20, 0), g("k", "c", 50, 60, 0)}, "a held it"},
		{"same start", []Grant{g("k", "a", 5, 10, 0), g("k", "b", 5, 10, 0)}, "overlap"},
		{"token not increasing", []Grant{g("k", "a", 0, 10, 5), g("k", "b", 10, 20, 5)}, "fencing token 5"},
		{"token decreasing later", []Grant{g("k", "a", 0, 10, 1), g("k", "b", 10, 20, 7), g("k", "c", 20, 30, 3)}, "does not exceed token 7"},
		{"negative window", []Grant{g("k", "a", 10, 0, 0)}, "before it starts"},
		{"semaphore: slots overlap up to its number", []Grant{sem(2, 0, "a", 0, 10), sem(2, 1, "b", 5, 15), sem(2, 0, "c", 10, 20)}, ""},
		{"semaphore: two numbers at once", []Grant{sem(2, 0, "a", 0, 10), sem(2, 1, "b", 5, 15), sem(3, 2, "c", 6, 8)}, "declared with 2 slots"},
		{"semaphore: more holders than slots", []Grant{sem(2, 0, "a", 0, 10), sem(2, 1, "b", 5, 15), sem(2, 2, "c", 9, 12)}, "3 holders"},
		{"semaphore: numbers may change between holders", []Grant{sem(2, 0, "a", 0, 10), sem(3, 0, "b", 10, 20), sem(3, 1, "c", 11, 20)}, ""},
		{"semaphore: a slot is a lock", []Grant{sem(2, 0, "a", 0, 10), sem(2, 0, "b", 9, 20)}, "overlap"},
		{"one kind: a lock, then a semaphore of its key", []Grant{g("s", "l", 0, 10, 0), sem(1, 0, "a", 9, 20)}, `key "s" is one kind: l held "s"`},
		{"one kind: a semaphore, then a lock of its key", []Grant{sem(2, 0, "a", 0, 30), sem(2, 1, "b", 5, 15), g("s", "l", 20, 40, 0)}, `a held "s:slot:0"`},
		{"one kind: the kinds may take turns", []Grant{g("s", "l", 0, 10, 0), sem(2, 0, "a", 10, 20), sem(2, 1, "b", 12, 25), g("s", "m", 25, 30, 0)}, ""},
		{"one kind: a lock of another key", []Grant{g("t", "l", 0, 10, 0), sem(1, 0, "a", 5, 20)}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.grants)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: unexpected violation: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("Check: violation %q not detected", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Check: error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestCheckRuns(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	run := func(sem string, slots, slot int, pod string, from, to int) Run {
		return Run{Semaphore: sem, Pod: pod, Slot: fmt.Sprintf("%s-%d-%d", sem, slots, slot), Slots: slots, Start: at(from), End: at(to)}
	}
	tests := []struct {
		name string
		runs []Run
		want string // substring of the error; "" means no violation
	}{
		{"empty", nil, ""},
		{"up to its number at once", []Run{run("s", 2, 0, "a", 0, 10), run("s", 2, 1, "b", 5, 15), run("s", 2, 0, "c", 10, 20)}, ""},
		{"one more than its number", []Run{run("s", 2, 0, "a", 0, 10), run("s", 2, 1, "b", 5, 15), run("s", 2, 0, "c", 9, 20)}, "3 pods that may run"},
		{"a pod of the previous number runs on after a shrink", []Run{run("s", 2, 1, "a", 0, 30), run("s", 1, 0, "b", 20, 40)}, "declared with 2 slots"},
		{"a pod of the previous number runs on after a growth", []Run{run("s", 1, 0, "a", 0, 30), run("s", 3, 0, "b", 20, 40)}, "declared with 1 slots"},
		{"the new number once the previous one's pods stopped", []Run{run("s", 2, 0, "a", 0, 10), run("s", 2, 1, "b", 0, 15), run("s", 1, 0, "c", 15, 40)}, ""},
		{"semaphores are counted apart", []Run{run("s", 1, 0, "a", 0, 10), run("t", 1, 0, "b", 5, 15)}, ""},
		{"a slot of no number", []Run{run("s", 0, 0, "a", 0, 10)}, "declares 0 slots"},
		{"negative window", []Run{run("s", 1, 0, "a", 10, 0)}, "before it starts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckRuns(tc.runs)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CheckRuns: unexpected violation: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("CheckRuns: violation %q not detected", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("CheckRuns: error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestRecorder(t *testing.T) {
	var r Recorder
	done := make(chan struct{})
	for i := range 8 {
		go func() {
			r.Record(Grant{Key: "k", Holder: fmt.Sprint(i)})
			done <- struct{}{}
		}()
	}
	for range 8 {
		<-done
	}
	if got := len(r.Grants()); got != 8 {
		t.Fatalf("recorded %d grants, want 8", got)
	}
}
