package distributedlock

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestRunPhases: a phase that fails or finishes early skips the phases
// after it but those that always run; halt stops them all; errors are
// named by their phase.
func TestRunPhases(t *testing.T) {
	boom := errors.New("boom")
	type step struct {
		f   flow
		err error
	}
	for _, tc := range []struct {
		name    string
		steps   map[string]step // by phase; missing: next, nil
		ran     string
		wantErr string
	}{
		{"every phase runs when each goes on", nil, "abcsd", ""},
		{"a phase finishing early skips to those that always run", map[string]step{"b": {f: finish}}, "abs", ""},
		{"a failing phase skips to those that always run, and its error is named", map[string]step{"c": {err: boom}}, "abcs", "c: boom"},
		{"halt stops every phase, even those that always run", map[string]step{"a": {f: halt, err: boom}}, "a", "a: boom"},
		{"halt without an error stops them too", map[string]step{"b": {f: halt}}, "ab", ""},
		{"a phase that always runs may fail too", map[string]step{"b": {f: finish}, "s": {err: boom}}, "abs", "s: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran strings.Builder
			mk := func(name string, always bool) phase {
				return phase{name: name, always: always, run: func(context.Context, *scope) (flow, error) {
					ran.WriteString(name)
					st := tc.steps[name]
					return st.f, st.err
				}}
			}
			err := runPhases(context.Background(), &scope{}, []phase{mk("a", false), mk("b", false), mk("c", false), mk("s", true), mk("d", false)})
			if ran.String() != tc.ran {
				t.Errorf("ran %q, want %q", ran.String(), tc.ran)
			}
			if got := errString(err); got != tc.wantErr {
				t.Errorf("error %q, want %q", got, tc.wantErr)
			}
		})
	}
}

// TestReconcilePhases holds the declared list to its order: the session is
// checked against status before any grant is made, released or shown, and
// only the phase that shows what is held runs after an earlier one
// stopped.
func TestReconcilePhases(t *testing.T) {
	var names, always []string
	for _, p := range (&Reconciler{}).phases() {
		names = append(names, p.name)
		if p.always {
			always = append(always, p.name)
		}
	}
	if got, want := strings.Join(names, ", "), "finalizer, session, master set, holder, show, holder node"; got != want {
		t.Errorf("phases %q, want %q", got, want)
	}
	if got := strings.Join(always, ", "); got != "show" {
		t.Errorf("phases that always run: %q, want show", got)
	}
}
