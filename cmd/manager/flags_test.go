package main

import (
	"strings"
	"testing"
)

// A malformed --lock-key-secret is refused with a message naming the flag,
// before anything starts.
func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		in, wantErr string
	}{
		{"redlock-system/key", ""},
		{"key", "want namespace/name"},
		{"/key", "want namespace/name"},
		{"ns/", "want namespace/name"},
		{"", "want namespace/name"},
	} {
		ref, err := parseRef(tc.in)
		switch {
		case tc.wantErr == "" && (err != nil || ref.String() != tc.in):
			t.Errorf("parseRef(%q) = %v, %v", tc.in, ref, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--lock-key-secret")):
			t.Errorf("parseRef(%q) error %v, want one naming the flag and %q", tc.in, err, tc.wantErr)
		}
	}
}
