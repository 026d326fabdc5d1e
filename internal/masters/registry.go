// Package masters keeps one pkg/redlock Client per RedisMasterSet, built from
// the set's spec and auth Secret and rebuilt when either changes.
package masters

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/certs"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// ErrAuthSecret reports a missing or unusable auth Secret.
var ErrAuthSecret = errors.New("auth secret")

// errNoKey reports an auth Secret without the password (or user name) key.
var errNoKey = errors.New("no key")

// ErrNotOptedIn reports an auth Secret without the label
// v1alpha1.RedisCredentialsLabel: "true". Nothing is sent to the masters.
var ErrNotOptedIn = errors.New("not labelled " + v1alpha1.RedisCredentialsLabel + `: "true"`)

// SecretUnusable reports whether an auth or TLS error says a Secret cannot
// serve — it or its key is gone, it does not opt in, or its certificate or
// key is malformed, mismatched or untrusted — as opposed to a transient
// failure to read it.
func SecretUnusable(err error) bool {
	return apierrors.IsNotFound(err) || errors.Is(err, errNoKey) || errors.Is(err, ErrNotOptedIn) || errors.Is(err, ErrNotOwned) ||
		errors.Is(err, certs.ErrNoCertificate) || errors.Is(err, certs.ErrKeyMismatch) || errors.Is(err, certs.ErrUntrusted)
}

// ObserverFunc returns the observer for a master set's client.
type ObserverFunc func(masterSet types.NamespacedName) redlock.Observer

// Registry maps master sets to clients. It is safe for concurrent use.
type Registry struct {
	// Reader reads auth Secrets (an uncached reader keeps the operator from
	// watching every Secret in the cluster).
	Reader client.Reader
	// Observer, when set, is attached to every client.
	Observer ObserverFunc
	// Options are appended to every client's options (tests use them).
	Options []redlock.Option
	// DefaultNodeTimeout applies to master sets without spec.nodeTimeout;
	// zero derives it from each lock's ttl (ttl/100 in [20ms, 200ms]).
	DefaultNodeTimeout time.Duration
	// ReleaseNotices: every release publishes a notice on the masters
	// (redlock.WithReleaseNotices), for waiters in any cluster.
	ReleaseNotices bool

	mu      sync.Mutex
	entries map[types.NamespacedName]*entry
}

type entry struct {
	spec        string // generation and UID of the master set
	fingerprint string // spec and the auth Secret's resourceVersion
	client      *redlock.Client
	checked     time.Time // when the auth Secret was last read
	// ready is closed once the clients this one replaced are closed, that
	// is once none of their requests is in flight any more: until then the
	// client is not handed out, so that a straggling SET or release of the
	// old client cannot land after the new client's requests on the same
	// keys.
	ready chan struct{}
	uid   types.UID
	// epoch is the set's status.membershipEpoch the client was built from;
	// a view of the set with a lower one is older than the client and is
	// not built from.
	epoch int64
	// jointSince, for a joint client (a membership change), is when this
	// process stopped using any client of the previous list alone: when
	// the first joint client of the change became ready. Zero until then.
	jointSince time.Time
}

// Client returns the client for ms, building it when the set is new or its
// spec changed. The auth Secret is read again when the client was built more
// than SecretRecheck ago; a changed Secret rebuilds the client, a Secret or
// key that is gone is an error (ErrAuthSecret), and a transient failure to
// read the Secret keeps the client of an unchanged spec. A rebuilt
// client is returned only once the client it replaced is closed (its
// in-flight requests, each bounded by its node timeout, have ended), or
// with ctx's error when ctx ends first.
func (r *Registry) Client(ctx context.Context, ms *v1alpha1.RedisMasterSet) (*redlock.Client, error) {
	return r.client(ctx, ms, false)
}

// Refresh is Client with the auth Secret read in any case.
func (r *Registry) Refresh(ctx context.Context, ms *v1alpha1.RedisMasterSet) (*redlock.Client, error) {
	return r.client(ctx, ms, true)
}

// SecretRecheck is how long a client is used before its auth Secret is read
// again.
const SecretRecheck = 30 * time.Second

func (r *Registry) client(ctx context.Context, ms *v1alpha1.RedisMasterSet, force bool) (*redlock.Client, error) {
	e, err := r.entry(ctx, ms, force)
	if err != nil {
		return nil, err
	}
	select { // a ready client is returned even on a done ctx
	case <-e.ready:
		return e.client, nil
	default:
	}
	select {
	case <-e.ready:
		return e.client, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("master set %s/%s: wait for the replaced client's requests to end: %w", ms.Namespace, ms.Name, context.Cause(ctx))
	}
}

// entry returns the entry of ms, building a new client when needed; the
// caller waits for its ready channel, outside the registry's mutex.
func (r *Registry) entry(ctx context.Context, ms *v1alpha1.RedisMasterSet, force bool) (*entry, error) {
	name := types.NamespacedName{Namespace: ms.Namespace, Name: ms.Name}
	addrs, err := GrantAddresses(ms)
	if err != nil {
		return nil, err
	}
	spec := specOf(ms, addrs)
	r.mu.Lock()
	if e, ok := r.entries[name]; ok && (e.newerThan(ms) || e.spec == spec && !force && (!namesSecrets(ms) || time.Since(e.checked) < SecretRecheck)) {
		r.mu.Unlock()
		return e, nil
	}
	r.mu.Unlock()

	cred, err := r.credentials(ctx, ms)
	if err != nil {
		if SecretUnusable(err) {
			return nil, err
		}
		// A transient failure to read the Secret (API server unavailable,
		// timeout, throttling…) says nothing about the credentials: keep
		// the working client of an unchanged spec, so that renewals go on;
		// the Secret is read again on the next call.
		r.mu.Lock()
		e, ok := r.entries[name]
		r.mu.Unlock()
		if ok && e.spec == spec {
			return e, nil
		}
		return nil, err
	}
	fp := spec + "/" + cred.version
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[name]; ok && (e.fingerprint == fp || e.newerThan(ms)) {
		e.checked = time.Now()
		return e, nil
	}
	c, err := r.build(name, ms, addrs, cred)
	if err != nil {
		return nil, err
	}
	e := &entry{spec: spec, fingerprint: fp, client: c, checked: time.Now(), ready: make(chan struct{}), uid: ms.UID, epoch: ms.Status.MembershipEpoch}
	r.install(name, e)
	return e, nil
}

// specOf identifies what a set's client is built from, the auth Secret
// aside: its generation and UID, its membership epoch and lists.
func specOf(ms *v1alpha1.RedisMasterSet, addrs []string) string {
	spec := strconv.FormatInt(ms.Generation, 10) + "/" + string(ms.UID) + "/" + strconv.FormatInt(ms.Status.MembershipEpoch, 10) + "/" + strings.Join(addrs, ",")
	if ch := ms.Status.MembershipChange; ch != nil {
		spec += "/joint:" + strings.Join(ch.Previous, ",")
	}
	return spec
}

// newerThan reports whether the entry was built from a view of the set
// newer than ms (an informer behind the status the set's controller
// wrote): a client of an earlier list is never built again.
func (e *entry) newerThan(ms *v1alpha1.RedisMasterSet) bool {
	return e.uid == ms.UID && e.epoch > ms.Status.MembershipEpoch
}

// install makes e the set's entry, with r.mu held: e is ready once the
// client it replaces is closed.
func (r *Registry) install(name types.NamespacedName, e *entry) {
	if r.entries == nil {
		r.entries = map[types.NamespacedName]*entry{}
	}
	c := e.client
	old, replaces := r.entries[name]
	if replaces && c.Joint() && old.client.Joint() && old.uid == e.uid && old.epoch == e.epoch {
		// Rebuilt within one change (a new Secret): no client of the
		// previous list alone ran in between.
		e.jointSince = old.jointSince
	}
	go func() {
		if replaces {
			_ = old.client.Close() // waits for its in-flight requests
			<-old.ready            // and for those of the clients it replaced
		}
		if c.Joint() {
			r.mu.Lock()
			if e.jointSince.IsZero() {
				e.jointSince = time.Now()
			}
			r.mu.Unlock()
		}
		close(e.ready)
	}()
	r.entries[name] = e
}

// JointFor returns, when the set's current client is the joint client of
// the membership change of epoch (of the set with that UID), for how long it has been the only kind
// of client this process uses: since the clients of the previous list
// alone it replaced were closed. ok is false before that, or when the
// client is another change's or not joint.
func (r *Registry) JointFor(name types.NamespacedName, uid types.UID, epoch int64) (d time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, found := r.entries[name]
	if !found || e.epoch != epoch || e.uid != uid || !e.client.Joint() || e.jointSince.IsZero() {
		return 0, false
	}
	return time.Since(e.jointSince), true
}

// Lookup returns the current client of a master set without reading
// anything, or nil when there is none yet. Like Client, it returns a rebuilt
// client only once the client it replaced is closed, waiting for that (at
// most the replaced client's node timeout).
func (r *Registry) Lookup(name types.NamespacedName) *redlock.Client {
	r.mu.Lock()
	e, ok := r.entries[name]
	r.mu.Unlock()
	if !ok {
		return nil
	}
	<-e.ready
	return e.client
}

// Forget closes and drops the client of a deleted master set.
func (r *Registry) Forget(name types.NamespacedName) {
	r.mu.Lock()
	e, ok := r.entries[name]
	delete(r.entries, name)
	r.mu.Unlock()
	if ok {
		_ = e.client.Close()
	}
}

// Close closes every client, those being replaced included.
func (r *Registry) Close() {
	r.mu.Lock()
	entries := r.entries
	r.entries = nil
	r.mu.Unlock()
	for _, e := range entries {
		_ = e.client.Close()
		<-e.ready
	}
}

func (r *Registry) build(name types.NamespacedName, ms *v1alpha1.RedisMasterSet, addrs []string, cred credentials) (*redlock.Client, error) {
	own := Quarantine(ms)
	opts := []redlock.Option{
		redlock.WithTries(1), // the controllers retry with their own jitter
		redlock.WithQuarantine(own),
	}
	// A longer window learned from the masters before this client was
	// built (kept in status across an operator restart) holds while it
	// stands.
	if w, u := ms.Status.QuarantineWindow, ms.Status.QuarantineWindowUntil; w != nil && u != nil && own > 0 && w.Duration > own && w.Duration <= redlock.MaxWindow {
		opts = append(opts, redlock.WithKnownWindow(w.Duration, u.Time))
	}
	if ch := ms.Status.MembershipChange; ch != nil {
		// Masters only in the new list vote once the change could end.
		opts = append(opts, redlock.WithJoint(ch.Previous, time.Now().Add(ch.Duration.Duration)))
	}
	if cred.pass != "" || cred.user != "" {
		opts = append(opts, redlock.WithAuth(cred.user, cred.pass))
	}
	if cred.tls != nil {
		opts = append(opts, redlock.WithTLS(cred.tls))
	}
	if d := r.nodeTimeout(ms); d > 0 {
		opts = append(opts, redlock.WithNodeTimeout(d))
	}
	if r.Observer != nil {
		opts = append(opts, redlock.WithObserver(r.Observer(name)))
	}
	if r.ReleaseNotices {
		opts = append(opts, redlock.WithReleaseNotices())
	}
	opts = append(opts, r.Options...)
	c, err := redlock.New(addrs, opts...)
	if err != nil {
		return nil, fmt.Errorf("master set %s: %w", name, err)
	}
	return c, nil
}

// nodeTimeout is the per-master timeout of a set's client: spec.nodeTimeout,
// else DefaultNodeTimeout; zero lets the client derive it from each lock's
// ttl.
func (r *Registry) nodeTimeout(ms *v1alpha1.RedisMasterSet) time.Duration {
	if ms.Spec.NodeTimeout != nil {
		return ms.Spec.NodeTimeout.Duration
	}
	return r.DefaultNodeTimeout
}

// ProbeTimeout bounds one probe of a set's masters by its client (see
// redlock.Client.Probe): the set's node timeout, or redlock.MaxNodeTimeout
// when the timeout is derived from each lock's ttl.
func (r *Registry) ProbeTimeout(ms *v1alpha1.RedisMasterSet) time.Duration {
	if d := r.nodeTimeout(ms); d > 0 {
		return d
	}
	return redlock.MaxNodeTimeout
}

// ErrNotAdopted reports a set whose controller has not adopted a list of
// masters yet (status.addresses): no lock is granted on a list status does
// not show.
var ErrNotAdopted = errors.New("the set's list of masters is not adopted yet (status.addresses is empty)")

// GrantAddresses returns the masters locks are granted on: the list the
// set's controller adopted (status.addresses), never the spec's.
func GrantAddresses(ms *v1alpha1.RedisMasterSet) ([]string, error) {
	if len(ms.Status.Addresses) == 0 {
		return nil, ErrNotAdopted
	}
	return ms.Status.Addresses, nil
}

// ChangeDuration is how long a membership change of the set lasts at
// least: every grant made on the previous list alone must have expired
// (maxLockTTL plus drift and margin, managed.SitOut) and the new masters
// must have sat out the set's quarantine window.
func ChangeDuration(ms *v1alpha1.RedisMasterSet) time.Duration {
	return max(Quarantine(ms), managed.SitOut(ms.Spec.MaxLockTTL.Duration))
}

// Addresses returns the masters' addresses the spec names: the managed
// members' (see managed.Addresses), then the external list.
func Addresses(ms *v1alpha1.RedisMasterSet) ([]string, error) {
	var out []string
	if ms.Spec.Managed != nil {
		out = managed.Addresses(ms)
	}
	if ms.Spec.External != nil {
		out = append(out, ms.Spec.External.Addresses...)
	}
	if len(out) == 0 {
		return nil, errors.New("no master addresses")
	}
	return out, nil
}

// Quarantine is the client-side quarantine window of a set's restarted
// masters. A master that may have lost its keys must not vote for at least
// maxLockTTL + drift (+ the margin of managed.SitOut), whatever the server
// side does; so the window is SitOut(maxLockTTL) for external sets and
// max(restartDelay, SitOut(maxLockTTL)) for managed ones. Only a managed
// AOFAlways set keeps every acknowledged write across restarts: it is not
// quarantined when its restart delay does not cover the longest TTL (the
// API allows that only for AOFAlways), and is quarantined for its restart
// delay otherwise. A set with external members as well quarantines every
// restarted master for at least SitOut: what runs the external ones is
// not known here.
func Quarantine(ms *v1alpha1.RedisMasterSet) time.Duration {
	ttl := ms.Spec.MaxLockTTL.Duration
	window := managed.SitOut(ttl)
	m := ms.Spec.Managed
	if m == nil {
		return window
	}
	delay := managed.RestartDelay(ms)
	if m.Persistence != v1alpha1.PersistenceAOFAlways || ms.Spec.External != nil {
		return max(delay, window)
	}
	if delay <= ttl+redlock.Drift(ttl) {
		return 0
	}
	return delay
}

// Password returns the password of the set's auth Secret when it may be
// used: the Secret exists, holds its keys and, unless it is the Secret a
// managed set generated, carries the opt-in label (ErrNotOptedIn). Nothing
// is sent to any master.
func (r *Registry) Password(ctx context.Context, ms *v1alpha1.RedisMasterSet) (string, error) {
	_, pass, _, err := r.auth(ctx, ms)
	return pass, err
}

// auth reads the password (and user name) from the set's auth Secret (for
// managed sets without one, the generated Secret).
func (r *Registry) auth(ctx context.Context, ms *v1alpha1.RedisMasterSet) (user, pass, version string, err error) {
	ref := ms.Spec.AuthSecretRef
	if ref == nil && ms.Spec.Managed != nil {
		ref = &v1alpha1.SecretKeyRef{Name: managed.SecretName(ms)}
	}
	if ref == nil {
		return "", "", "", nil
	}
	// The Secret a managed set generated is its own; any other must opt in.
	s, err := ReadSecret(ctx, r.Reader, ms, ref.Name, ms.Spec.AuthSecretRef == nil)
	if err != nil {
		return "", "", "", fmt.Errorf("%w %q: %w", ErrAuthSecret, ref.Name, err)
	}
	key := ref.Key
	if key == "" {
		key = "password"
	}
	p, err := value(s, key)
	if err != nil {
		return "", "", "", fmt.Errorf("%w %q: %w", ErrAuthSecret, ref.Name, err)
	}
	if ms.Spec.Managed != nil {
		// Managed masters know one user, whose ACL the operator writes.
		return managed.ManagedUser, string(p), s.ResourceVersion, nil
	}
	if ref.UsernameKey != "" {
		u, err := value(s, ref.UsernameKey)
		if err != nil {
			return "", "", "", fmt.Errorf("%w %q: %w", ErrAuthSecret, ref.Name, err)
		}
		user = string(u)
	}
	return user, string(p), s.ResourceVersion, nil
}
