package lockvalue

import (
	"bytes"
	"testing"
)

func TestValue(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	d, err := New(key)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := New(bytes.Repeat([]byte{8}, 32))
	v := d.Value("uid-1", "g1")
	if v != d.Value("uid-1", "g1") {
		t.Fatal("not deterministic")
	}
	for name, w := range map[string]string{
		"next grant":    d.Value("uid-1", "g2"),
		"other lock":    d.Value("uid-2", "g1"),
		"other key":     other.Value("uid-1", "g1"),
		"ambiguous cat": d.Value("uid-1g", "1"),
	} {
		if w == v {
			t.Errorf("%s gives the same value", name)
		}
	}
	if len(v) != 43 {
		t.Errorf("len = %d, want 43 (256 bits, base64url)", len(v))
	}
	if _, err := New(key[:31]); err == nil {
		t.Error("short key accepted")
	}
}

func TestNewGrantIDIsFreshEveryTime(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewGrantID()
		if len(id) != 22 {
			t.Fatalf("grant ID %q: len %d, want 22 (128 bits, base64url)", id, len(id))
		}
		if seen[id] {
			t.Fatalf("grant ID %q drawn twice", id)
		}
		seen[id] = true
	}
}
