package main

import (
	"flag"
	"io"
	"slices"
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

// --watch-namespaces takes namespace names, comma-separated or repeated;
// --watch-nodes follows it unless given: a manager limited to namespaces
// reads no Node unless told to.
func TestWatchFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    []string
		nodes   bool
		wantErr string
	}{
		{args: nil, want: nil, nodes: true},
		{args: []string{"--watch-namespaces="}, want: nil, nodes: true},
		{args: []string{"--watch-namespaces=team-a"}, want: []string{"team-a"}},
		{args: []string{"--watch-namespaces=team-a, team-b,,team-a"}, want: []string{"team-a", "team-b"}},
		{args: []string{"--watch-namespaces=team-a", "--watch-namespaces=team-c"}, want: []string{"team-a", "team-c"}},
		{args: []string{"--watch-namespaces=team-a", "--watch-nodes"}, want: []string{"team-a"}, nodes: true},
		{args: []string{"--watch-nodes=false"}, want: nil},
		{args: []string{"--watch-namespaces=Team_A"}, wantErr: `namespace "Team_A"`},
		{args: []string{"--watch-namespaces=team-a/locks"}, wantErr: `namespace "team-a/locks"`},
	} {
		var cfg config
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		parsed := watchFlags(fs, &cfg)
		err := fs.Parse(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "-watch-namespaces") {
				t.Errorf("%q: error %v, want one naming the flag and %s", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		parsed()
		if !slices.Equal(cfg.watchNamespaces, tc.want) || cfg.watchNodes != tc.nodes || !slices.Equal(cfg.webhook.WatchNamespaces, tc.want) {
			t.Errorf("%q: namespaces %q (webhook %q), nodes %v; want %q, %v", tc.args, cfg.watchNamespaces, cfg.webhook.WatchNamespaces, cfg.watchNodes, tc.want, tc.nodes)
		}
	}
}
