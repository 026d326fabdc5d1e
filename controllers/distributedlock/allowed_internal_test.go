package distributedlock

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// TestNamespaceRule: the oldest object of a key that names namespaces
// governs the key; a later one naming others refuses only itself (a tenant
// cannot take a key from its owner by creating a lock of its own);
// slots follow their semaphore, and objects being deleted or naming no
// namespaces count for nothing.
func TestNamespaceRule(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lock := func(ns, name string, age time.Duration, namespaces ...string) *v1alpha1.DistributedLock {
		l := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.Time{Time: t0.Add(age)}},
			Spec:       v1alpha1.DistributedLockSpec{Key: "k"},
		}
		if namespaces != nil {
			l.Spec.AllowedHolders = &v1alpha1.AllowedHolders{Namespaces: namespaces}
		}
		return l
	}
	refusal := func(ns string, objs ...client.Object) string {
		var rules []rule
		for _, o := range objs {
			if r, key, ok := ruleOf(o); ok {
				if key != "lock:k" {
					t.Fatalf("rule of %s is about %q", o.GetName(), key)
				}
				rules = append(rules, r)
			}
		}
		return namespaceRefusal(ns, "key k", rules)
	}
	owner := lock("billing", "ledger", 0, "billing", "batch")
	squatter := lock("evil", "ledger", time.Second, "evil")
	for _, tc := range []struct {
		name    string
		ns      string
		objs    []client.Object
		refused bool
	}{
		{"no rule", "evil", []client.Object{lock("billing", "ledger", 0), lock("evil", "x", 0)}, false},
		{"the owner's namespace", "billing", []client.Object{owner}, false},
		{"another namespace the owner allows", "batch", []client.Object{owner}, false},
		{"a namespace the owner does not name", "evil", []client.Object{owner}, true},
		{"a later rule does not refuse the owner", "billing", []client.Object{owner, squatter}, false},
		{"nor admit its own namespace", "evil", []client.Object{squatter, owner}, true},
		{"the same age: the first namespace governs", "b", []client.Object{lock("b", "x", 0, "b"), lock("a", "x", 0, "a")}, true},
		{"the same age: the first namespace governs, itself allowed", "a", []client.Object{lock("b", "x", 0, "b"), lock("a", "x", 0, "a")}, false},
		{"a rule being deleted counts for nothing", "evil", []client.Object{func() client.Object {
			l := lock("billing", "ledger", 0, "billing")
			l.DeletionTimestamp = &metav1.Time{Time: t0}
			return l
		}()}, false},
		{"a lock's own rule may refuse itself", "billing", []client.Object{lock("billing", "ledger", 0, "other")}, true},
	} {
		if got := refusal(tc.ns, tc.objs...); (got != "") != tc.refused {
			t.Errorf("%s: refusal %q, want refused %v", tc.name, got, tc.refused)
		}
	}
	if msg := refusal("evil", squatter, owner); !strings.Contains(msg, "DistributedLock billing/ledger") || !strings.Contains(msg, "billing, batch") {
		t.Errorf("the refusal does not name the governing lock and its list: %q", msg)
	}

	slot := lock("evil", "s-1-0", 0, "evil")
	slot.Spec.SlotOf = &v1alpha1.SemaphoreSlot{SemaphoreKey: "sem", Slots: 1, Index: 0}
	if _, _, ok := ruleOf(slot); ok {
		t.Error("a slot's lock has a rule of its own; its semaphore's governs")
	}
	if policyKey(slot) != "semaphore:sem" {
		t.Errorf("policyKey of a slot = %q", policyKey(slot))
	}
	sem := &v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "sem"},
		Spec: v1alpha1.DistributedSemaphoreSpec{Key: "sem", AllowedHolders: &v1alpha1.AllowedHolders{Namespaces: []string{"ops"}}}}
	if r, key, ok := ruleOf(sem); !ok || key != "semaphore:sem" || r.kind != "DistributedSemaphore" {
		t.Errorf("ruleOf(semaphore) = %+v, %q, %v", r, key, ok)
	}
}
