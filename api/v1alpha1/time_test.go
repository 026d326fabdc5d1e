package v1alpha1

import (
	"encoding/json"
	"testing"
	"time"
)

func TestPreciseTimeReadsBothForms(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want time.Time
	}{
		{"microseconds, as this version writes", `"2026-11-30T06:40:42.123456Z"`, time.Date(2026, 11, 30, 6, 40, 42, 123456000, time.UTC)},
		{"whole seconds, as metav1.Time wrote before", `"2026-11-30T06:40:42Z"`, time.Date(2026, 11, 30, 6, 40, 42, 0, time.UTC)},
		{"nanoseconds are rounded down to microseconds", `"2026-11-30T06:40:42.123456789Z"`, time.Date(2026, 11, 30, 6, 40, 42, 123456000, time.UTC)},
		{"null is the zero time", `null`, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got PreciseTime
			if err := json.Unmarshal([]byte(tc.in), &got); err != nil {
				t.Fatal(err)
			}
			if !got.Equal(tc.want) {
				t.Errorf("read %s as %v, want %v", tc.in, got.Time, tc.want)
			}
		})
	}
	out, err := json.Marshal(NewPreciseTime(time.Date(2026, 11, 30, 6, 40, 42, 123456789, time.FixedZone("x", 3600))))
	if err != nil || string(out) != `"2026-11-30T05:40:42.123456Z"` {
		t.Errorf("wrote %s (%v), want UTC with microseconds rounded down", out, err)
	}
	if _, err := json.Marshal(struct{ T PreciseTime }{}); err != nil {
		t.Errorf("zero time: %v", err)
	}
}
