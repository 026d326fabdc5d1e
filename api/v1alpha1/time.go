package v1alpha1

import (
	"encoding/json"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PreciseTime is an instant stored with microsecond precision in RFC 3339
// form (like metav1.MicroTime). It also reads the whole-second form of
// metav1.Time, which earlier versions of this API wrote for the same
// fields, so that existing objects keep decoding after an upgrade.
//
// +kubebuilder:validation:Type=string
// +kubebuilder:validation:Format=date-time
type PreciseTime struct {
	time.Time `json:"-"`
}

// NewPreciseTime returns t, rounded down to the microsecond, or nil for the
// zero time. Rounding down keeps a shown validity from exceeding the real
// one.
func NewPreciseTime(t time.Time) *PreciseTime {
	if t.IsZero() {
		return nil
	}
	return &PreciseTime{Time: t.Truncate(time.Microsecond)}
}

// DeepCopyInto copies t into out.
func (t *PreciseTime) DeepCopyInto(out *PreciseTime) { *out = *t }

// DeepCopy returns a copy of t.
func (t *PreciseTime) DeepCopy() *PreciseTime {
	if t == nil {
		return nil
	}
	out := *t
	return &out
}

// MarshalJSON writes the time in UTC with microseconds, or null.
func (t PreciseTime) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return json.Marshal(t.UTC().Format(metav1.RFC3339Micro))
}

// UnmarshalJSON reads RFC 3339 with or without a fraction of a second.
func (t *PreciseTime) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	pt, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return err
	}
	t.Time = pt.Truncate(time.Microsecond).Local()
	return nil
}
