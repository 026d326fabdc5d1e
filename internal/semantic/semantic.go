// Package semantic compares API values as apimachinery's equality.Semantic
// does, and this API's PreciseTime by the instant it names: Semantic alone
// panics on a PreciseTime (a time.Time it has no rule for, whose fields
// are unexported).
package semantic

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/conversion"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

var equalities = func() conversion.Equalities {
	e := equality.Semantic.Copy()
	if err := e.AddFunc(func(a, b v1alpha1.PreciseTime) bool { return a.Equal(b.Time) }); err != nil {
		panic(err)
	}
	return e
}()

// Equal reports whether a and b are semantically equal.
func Equal(a, b any) bool { return equalities.DeepEqual(a, b) }
