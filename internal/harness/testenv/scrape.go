package testenv

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Samples gathers reg as Prometheus would scrape it and returns every
// sample of the family name whose labels include want (none: the family
// is absent).
func Samples(reg prometheus.Gatherer, name string, want map[string]string) ([]*dto.Metric, error) {
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for k, v := range want {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			out = append(out, m)
		}
	}
	return out, nil
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// Value is the value of the single gauge or counter sample of name with
// the labels want: ok is false when there is none, or more than one.
func Value(reg prometheus.Gatherer, name string, want map[string]string) (v float64, ok bool, err error) {
	ms, err := Samples(reg, name, want)
	if err != nil || len(ms) != 1 {
		return 0, false, err
	}
	switch {
	case ms[0].GetGauge() != nil:
		return ms[0].GetGauge().GetValue(), true, nil
	case ms[0].GetCounter() != nil:
		return ms[0].GetCounter().GetValue(), true, nil
	}
	return 0, false, nil
}
