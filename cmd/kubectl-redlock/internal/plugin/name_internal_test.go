package plugin

import "testing"

func TestName(t *testing.T) {
	for _, tc := range []struct {
		arg, want, err string
	}{
		{"web-0", "web-0", ""},
		{"pod/web-0", "web-0", ""},
		{"Pods/web-0", "web-0", ""},
		{"dlock/web-0", "", `"dlock/web-0" is not a name: give NAME or pod/NAME`},
		{"pod/", "", `"pod/" is not a name: give NAME or pod/NAME`},
		{"pod/a/b", "", `"pod/a/b" is not a name: give NAME or pod/NAME`},
	} {
		got, err := name(tc.arg, podTypes...)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("name(%q) = %q, %v; want %q, %q", tc.arg, got, err, tc.want, tc.err)
		}
	}
	if got, err := name("dlock/migrations", lockTypes...); got != "migrations" || err != nil {
		t.Errorf("name(dlock/migrations) = %q, %v", got, err)
	}
}
