package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Token is the output of `token POD`.
type Token struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string `json:"namespace"`
	Pod             string `json:"pod"`
	// Lock is the lock the pod holds, was granted (annotation
	// redlock.dev/lock-name) or asks for (label redlock.dev/lock).
	Lock string `json:"lock,omitempty"`
	Key  string `json:"key,omitempty"`
	// Holds: the lock's status shows the pod as its holder, within the
	// validity shown.
	Holds bool `json:"holds"`
	// FencingToken is the token of the pod's current grant (from the lock's
	// status); 0 when it holds nothing.
	FencingToken int64      `json:"fencingToken"`
	ValidUntil   *time.Time `json:"validUntil"`
	ValidFor     string     `json:"validFor"`
	// AnnotatedToken is the pod's annotation redlock.dev/fencing-token, as
	// written (it stays after the grant ended); empty when absent.
	AnnotatedToken string `json:"annotatedToken,omitempty"`
	// Explanation says in a sentence what the pod holds.
	Explanation string `json:"explanation"`
}

// LockNameOf is the lock a pod's token belongs to: the lock that granted
// it one (annotation redlock.dev/lock-name), else the lock it asks for
// (label redlock.dev/lock); empty for neither.
func LockNameOf(pod *corev1.Pod) string {
	if n := pod.Annotations[v1alpha1.LockNameAnnotation]; n != "" {
		return n
	}
	return pod.Labels[v1alpha1.LockLabel]
}

// TokenOf describes the fencing token of pod, whose lock (see LockNameOf)
// is lock (nil when it names none or it does not exist), at now.
func TokenOf(pod *corev1.Pod, lock *v1alpha1.DistributedLock, now time.Time) Token {
	t := Token{TypeMeta: typeMeta("PodToken"), Namespace: pod.Namespace, Pod: pod.Name, Lock: LockNameOf(pod), ValidFor: none,
		AnnotatedToken: pod.Annotations[v1alpha1.FencingTokenAnnotation]}
	if lock != nil {
		t.Key = Key(lock)
	} else if k := pod.Annotations[v1alpha1.LockKeyAnnotation]; k != "" {
		t.Key = k
	}
	ref := fmt.Sprintf("pod %s/%s", pod.Namespace, pod.Name)
	if lock != nil && lock.Status.Holder != nil && lock.Status.Holder.Pod != nil && lock.Status.Holder.Pod.UID == pod.UID {
		until, valid, shown := Validity(lock.Status, now)
		t.ValidUntil, t.ValidFor = until, shown
		if valid {
			t.Holds, t.FencingToken = true, lock.Status.FencingToken
			t.Explanation = fmt.Sprintf("%s holds lock %s (key %s) with fencing token %d, valid for %s", ref, t.Lock, t.Key, t.FencingToken, shown)
			switch {
			case t.AnnotatedToken == "":
				t.Explanation += fmt.Sprintf("; the operator has not yet written the annotation %s", v1alpha1.FencingTokenAnnotation)
			case t.AnnotatedToken != strconv.FormatInt(t.FencingToken, 10):
				t.Explanation += fmt.Sprintf("; its annotation %s still shows %s, from an earlier grant, until the operator updates it", v1alpha1.FencingTokenAnnotation, t.AnnotatedToken)
			}
			return t
		}
		t.Explanation = fmt.Sprintf("%s holds nothing: status shows it as the holder of lock %s, but the validity shown has passed", ref, t.Lock)
	} else {
		switch {
		case t.Lock == "":
			t.Explanation = fmt.Sprintf("%s holds nothing: it asks for no lock (no label %s)", ref, v1alpha1.LockLabel)
		case lock == nil:
			t.Explanation = fmt.Sprintf("%s holds nothing: its lock %s does not exist", ref, t.Lock)
		default:
			t.Explanation = fmt.Sprintf("%s holds nothing: lock %s is %s", ref, t.Lock, heldBy(lock))
		}
	}
	if t.AnnotatedToken != "" {
		t.Explanation += fmt.Sprintf("; its annotation %s=%s is from a grant it no longer holds: writes fenced with it are refused once a newer token was used", v1alpha1.FencingTokenAnnotation, t.AnnotatedToken)
	}
	return t
}

func heldBy(lock *v1alpha1.DistributedLock) string {
	h := holderOf(lock.Status)
	if h == nil {
		return "held by nobody"
	}
	return "held by " + h.String()
}

// WriteToken prints `token` as a description.
func WriteToken(w io.Writer, t *Token) error {
	var b strings.Builder
	line := func(k, format string, a ...any) { fmt.Fprintf(&b, "%-11s %s\n", k+":", fmt.Sprintf(format, a...)) }
	line("Pod", "%s/%s", t.Namespace, t.Pod)
	switch {
	case t.Lock == "":
		line("Lock", "%s", none)
	case t.Key != "":
		line("Lock", "%s/%s (key %s)", t.Namespace, t.Lock, t.Key)
	default:
		line("Lock", "%s/%s", t.Namespace, t.Lock)
	}
	if t.Holds {
		line("Holds", "yes, %s", validityText(t.ValidFor))
		line("Token", "%d", t.FencingToken)
	} else {
		line("Holds", "no")
		line("Token", "%s", none)
	}
	if t.AnnotatedToken != "" {
		line("Annotation", "%s=%s", v1alpha1.FencingTokenAnnotation, t.AnnotatedToken)
	}
	line("Why", "%s", t.Explanation)
	_, err := io.WriteString(w, b.String())
	return err
}
