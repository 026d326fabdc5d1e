package redlock

import (
	"slices"
	"testing"
	"time"
)

// TestNoticesCallBackOncePerReleaseAtAQuorum: told calls back once per
// release (its id), when a quorum of distinct masters told of it within
// noticeWindow, and never for a key not watched.
func TestNoticesCallBackOncePerReleaseAtAQuorum(t *testing.T) {
	type notice struct {
		master int
		key    string
		id     string
		after  time.Duration // since the first notice
	}
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name    string
		notices []notice
		want    []string
	}{
		{"one release, three masters", []notice{{0, "k", "a", 0}, {1, "k", "a", 0}, {2, "k", "a", 0}}, []string{"k"}},
		{"a minority", []notice{{0, "k", "a", 0}}, nil},
		{"one master twice", []notice{{0, "k", "a", 0}, {0, "k", "a", 0}}, nil},
		{"two releases interleaved, the first's straggler after the second began", []notice{
			{0, "k", "a", 0}, {1, "k", "a", 0}, {0, "k", "b", 0}, {2, "k", "a", 0}, {1, "k", "b", 0}, {2, "k", "b", 0},
		}, []string{"k", "k"}},
		{"a straggler of one release does not complete another", []notice{
			{0, "k", "a", 0}, {1, "k", "a", 0}, {0, "k", "b", 0}, {2, "k", "a", 0},
		}, []string{"k"}},
		{"notices further apart than the window", []notice{{0, "k", "a", 0}, {1, "k", "a", noticeWindow + time.Millisecond}}, nil},
		{"a key not watched", []notice{{0, "other", "a", 0}, {1, "other", "a", 0}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			w := &Notices{
				c:         &Client{quorum: 2},
				onRelease: func(key string) { got = append(got, key) },
				watched:   map[string]int{NoticeChannel("k"): 1},
				heard:     map[heardKey]*heard{},
			}
			for _, n := range tc.notices {
				w.told(n.master, n.key, n.id, t0.Add(n.after))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("called back %v, want %v", got, tc.want)
			}
		})
	}
}
