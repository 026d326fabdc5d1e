package grants

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

func TestPublishDue(t *testing.T) {
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(time.Unix(1000, 0).Add(d)) }
	last := v1alpha1.StatusWriterReport{Published: at(0), Kept: 10}
	same := func(d time.Duration) v1alpha1.StatusWriterReport { r := last; r.Published = at(d); return r }
	changed := same(publishEvery)
	changed.Kept = 9
	cases := []struct {
		name                   string
		first, kicked, refused bool
		r                      v1alpha1.StatusWriterReport
		sinceTry               time.Duration
		want                   bool
	}{
		{name: "the first report", first: true, r: same(0), want: true},
		{name: "unchanged a tick later", r: same(publishEvery), sinceTry: publishEvery, want: false},
		{name: "changed a tick later", r: changed, sinceTry: publishEvery, want: true},
		{name: "unchanged a beat later", r: same(publishBeat), sinceTry: publishBeat, want: true},
		{name: "unchanged a late tick short of a beat", r: same(publishBeat - publishEvery/2), sinceTry: publishBeat - publishEvery/2, want: true},
		{name: "unchanged, most of a beat later", r: same(publishBeat - publishEvery), sinceTry: publishBeat - publishEvery, want: false},
		{name: "the overload turned over", kicked: true, r: same(time.Second), sinceTry: time.Second, want: true},
		{name: "refused, changed a tick later", refused: true, r: changed, sinceTry: publishEvery, want: false},
		{name: "refused, kicked", refused: true, kicked: true, r: changed, sinceTry: publishEvery, want: false},
		{name: "refused, a beat later", refused: true, r: same(publishBeat), sinceTry: publishBeat, want: true},
	}
	for _, c := range cases {
		if got := publishDue(c.first, c.kicked, c.refused, c.r, last, c.sinceTry); got != c.want {
			t.Errorf("%s: publishDue = %v, want %v", c.name, got, c.want)
		}
	}
}
