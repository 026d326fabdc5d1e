package report

import (
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// APIVersion is the apiVersion of the documents the read commands print.
// No API server serves it: it names the shapes of this package.
const APIVersion = "report.redlock.dev/v1alpha1"

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: APIVersion, Kind: kind}
}

// Document is what a read command prints: a runtime.Object for kubectl's
// printers.
type Document interface {
	runtime.Object
}

// Named is a Document that lists objects of the cluster, which `-o name`
// prints as TYPE/NAME, as kubectl does.
type Named interface {
	Document
	// Names are the objects, as kubectl's -o name prints them.
	Names() []string
}

// Resource names as `kubectl get -o name` prints them.
const (
	lockResource      = "distributedlock.coordination.redlock.dev/"
	semaphoreResource = "distributedsemaphore.coordination.redlock.dev/"
	podResource       = "pod/"
)

// Names are the locks, then the semaphores.
func (l *LockList) Names() []string {
	out := make([]string, 0, len(l.Items)+len(l.Semaphores))
	for _, x := range l.Items {
		out = append(out, lockResource+x.Name)
	}
	for _, x := range l.Semaphores {
		out = append(out, semaphoreResource+x.Name)
	}
	return out
}

// Names are the locks on the key, then the locks of the held slots.
func (k *KeyHolders) Names() []string {
	out := make([]string, 0, len(k.Items)+len(k.Slots))
	for _, x := range k.Items {
		out = append(out, lockResource+x.Name)
	}
	for _, x := range k.Slots {
		out = append(out, lockResource+x.Lock)
	}
	return out
}

// Names are the pods listed as waiting, in order.
func (q *Queue) Names() []string {
	out := make([]string, 0, len(q.Waiting))
	for _, e := range q.Waiting {
		out = append(out, podResource+e.Pod)
	}
	return out
}

// DeepCopyObject copies l.
func (l *LockList) DeepCopyObject() runtime.Object { return deepCopy(l) }

// DeepCopyObject copies k.
func (k *KeyHolders) DeepCopyObject() runtime.Object { return deepCopy(k) }

// DeepCopyObject copies q.
func (q *Queue) DeepCopyObject() runtime.Object { return deepCopy(q) }

// DeepCopyObject copies y.
func (y *Why) DeepCopyObject() runtime.Object { return deepCopy(y) }

// DeepCopyObject copies t.
func (t *Token) DeepCopyObject() runtime.Object { return deepCopy(t) }

// deepCopy copies a document through its JSON form, which is all of it:
// the documents are printed, never changed, so no generated copy is kept.
func deepCopy[T any](v *T) *T {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("copy a %T: %v", v, err)) // plain data: cannot fail
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		panic(fmt.Sprintf("copy a %T: %v", v, err))
	}
	return out
}
