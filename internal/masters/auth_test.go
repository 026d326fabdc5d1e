package masters

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// secretReader serves one Secret, or fails with err.
type secretReader struct {
	mu     sync.Mutex
	secret *corev1.Secret
	err    error
}

func (f *secretReader) set(s *corev1.Secret, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secret, f.err = s, err
}

func (f *secretReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	out, ok := obj.(*corev1.Secret)
	if !ok || key.Name != f.secret.Name || key.Namespace != f.secret.Namespace {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, key.Name)
	}
	f.secret.DeepCopyInto(out)
	return nil
}

func (f *secretReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("secretReader: List is not supported")
}

func TestAuthSecretErrors(t *testing.T) {
	secret := func(data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: "auth", ResourceVersion: "1", Labels: map[string]string{v1alpha1.RedisCredentialsLabel: "true"},
		}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	good := secret(map[string]string{"password": "p"})
	secrets := schema.GroupResource{Resource: "secrets"}
	type call int
	const (
		refresh            call = iota // Refresh reads the Secret in any case
		clientAfterRecheck             // Client reads it once SecretRecheck has passed
	)
	for _, tc := range []struct {
		name       string
		prior      bool // a client was built before the failure
		generation int64
		via        call
		secret     *corev1.Secret
		err        error
		keep       bool // the prior client is returned without error
		notFound   bool // the error says NotFound
		notOptedIn bool // the error says ErrNotOptedIn
	}{
		{name: "an unavailable API server keeps the working client", prior: true, err: apierrors.NewServiceUnavailable("etcd"), keep: true},
		{name: "an API timeout keeps the working client", prior: true, err: apierrors.NewTimeoutError("get secret", 1), keep: true},
		{name: "throttling keeps the working client", prior: true, err: apierrors.NewTooManyRequests("slow down", 1), keep: true},
		{name: "a broken connection keeps the working client", prior: true, err: errors.New("dial tcp 10.0.0.1:443: connect: connection refused"), keep: true},
		{name: "a transient error on the periodic recheck of Client keeps the working client", prior: true, via: clientAfterRecheck, err: apierrors.NewServiceUnavailable("etcd"), keep: true},
		{name: "a deleted Secret is an error", prior: true, err: apierrors.NewNotFound(secrets, "auth"), notFound: true},
		{name: "a deleted Secret on the periodic recheck of Client is an error", prior: true, via: clientAfterRecheck, err: apierrors.NewNotFound(secrets, "auth"), notFound: true},
		{name: "a Secret without the password key is an error", prior: true, secret: secret(map[string]string{"other": "p"})},
		{name: "a Secret with an empty password is an error", prior: true, secret: secret(map[string]string{"password": ""})},
		{name: "a Secret whose opt-in label was removed is an error", prior: true, secret: func() *corev1.Secret {
			s := secret(map[string]string{"password": "p"})
			s.Labels = nil
			return s
		}(), notOptedIn: true},
		{name: "a Secret whose opt-in label is not \"true\" is an error", prior: true, secret: func() *corev1.Secret {
			s := secret(map[string]string{"password": "p"})
			s.Labels[v1alpha1.RedisCredentialsLabel] = "yes"
			return s
		}(), notOptedIn: true},
		{name: "a transient error with a changed spec is an error: no client of that spec works yet", prior: true, generation: 2, err: apierrors.NewServiceUnavailable("etcd")},
		{name: "a transient error before any client was built is an error", err: apierrors.NewServiceUnavailable("etcd")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reader := &secretReader{secret: good}
			reg := &Registry{Reader: reader}
			defer reg.Close()
			ms := &v1alpha1.RedisMasterSet{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "locks", UID: "u1", Generation: 1},
				Spec: v1alpha1.RedisMasterSetSpec{
					MaxLockTTL:    metav1.Duration{Duration: 10 * time.Second},
					AuthSecretRef: &v1alpha1.SecretKeyRef{Name: "auth"},
					External:      &v1alpha1.ExternalMasters{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}},
				},
				Status: v1alpha1.RedisMasterSetStatus{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}},
			}
			var prior *redlock.Client
			if tc.prior {
				c, err := reg.Client(ctx, ms)
				if err != nil {
					t.Fatalf("first client: %v", err)
				}
				prior = c
			}
			reader.set(tc.secret, tc.err)
			if tc.secret == nil && tc.err == nil {
				t.Fatal("case sets neither a secret nor an error")
			}
			if tc.generation != 0 {
				ms.Generation = tc.generation
			}
			var got *redlock.Client
			var err error
			switch tc.via {
			case refresh:
				got, err = reg.Refresh(ctx, ms)
			case clientAfterRecheck:
				reg.mu.Lock()
				reg.entries[types.NamespacedName{Namespace: "ns", Name: "locks"}].checked = time.Now().Add(-SecretRecheck)
				reg.mu.Unlock()
				got, err = reg.Client(ctx, ms)
			}
			if tc.keep {
				if err != nil || got != prior {
					t.Fatalf("got %v, %v; want the working client %v and no error", got, err, prior)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrAuthSecret) {
				t.Fatalf("got %v, %v; want an ErrAuthSecret error", got, err)
			}
			if apierrors.IsNotFound(err) != tc.notFound {
				t.Fatalf("error %q: NotFound %v, want %v", err, apierrors.IsNotFound(err), tc.notFound)
			}
			if errors.Is(err, ErrNotOptedIn) != tc.notOptedIn {
				t.Fatalf("error %q: not opted in %v, want %v", err, errors.Is(err, ErrNotOptedIn), tc.notOptedIn)
			}
		})
	}
}

// The Secret a managed set generated (controlled by the set) needs no
// label; a Secret of the same name that the set does not control is not
// used, labelled or not: someone else planted it.
func TestGeneratedSecretIsTheSetsOwn(t *testing.T) {
	ms := &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "locks", UID: "u1", Generation: 1},
		Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: 10 * time.Second},
			Managed:    &v1alpha1.ManagedMasters{Replicas: 3, Port: 6379},
		},
	}
	for _, tc := range []struct {
		name     string
		owner    []metav1.OwnerReference
		labelled bool
		ok       bool
	}{
		{"controlled by the set", []metav1.OwnerReference{{APIVersion: "v1", Kind: "RedisMasterSet", Name: "locks", UID: "u1", Controller: new(true)}}, false, true},
		{"controlled by another object", []metav1.OwnerReference{{APIVersion: "v1", Kind: "RedisMasterSet", Name: "locks", UID: "u2", Controller: new(true)}}, false, false},
		{"not controlled", nil, false, false},
		{"not controlled, though labelled as credentials", nil, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "locks-auth", OwnerReferences: tc.owner},
				Data:       map[string][]byte{"password": []byte("p")},
			}
			if tc.labelled {
				s.Labels = map[string]string{v1alpha1.RedisCredentialsLabel: "true"}
			}
			reg := &Registry{Reader: &secretReader{secret: s}}
			defer reg.Close()
			_, err := reg.Password(context.Background(), ms)
			if (err == nil) != tc.ok || (err != nil && (!errors.Is(err, ErrNotOwned) || !SecretUnusable(err))) {
				t.Fatalf("got %v, want usable %v (else ErrNotOwned)", err, tc.ok)
			}
		})
	}
}
