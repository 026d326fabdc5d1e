package masters

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// wireEvent is one Read or Write on a connection to a master.
type wireEvent struct {
	fresh bool // the connection was dialed after the rebuild began
	addr  string
	read  bool
}

// wire records, in order, every Read and Write on the connections its
// dialer made.
type wire struct {
	fresh  atomic.Bool // connections dialed from now on belong to the new client
	mu     sync.Mutex
	events []wireEvent
	// freshIO is closed at the first I/O on a fresh connection.
	freshIO   chan struct{}
	freshOnce sync.Once
}

func (w *wire) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &tracedConn{Conn: c, w: w, fresh: w.fresh.Load(), addr: addr}, nil
}

func (w *wire) record(ev wireEvent) {
	w.mu.Lock()
	w.events = append(w.events, ev)
	w.mu.Unlock()
	if ev.fresh {
		w.freshOnce.Do(func() { close(w.freshIO) })
	}
}

func (w *wire) log() []wireEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]wireEvent(nil), w.events...)
}

type tracedConn struct {
	net.Conn
	w     *wire
	fresh bool
	addr  string
}

func (c *tracedConn) Write(b []byte) (int, error) {
	c.w.record(wireEvent{fresh: c.fresh, addr: c.addr})
	return c.Conn.Write(b)
}

func (c *tracedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.w.record(wireEvent{fresh: c.fresh, addr: c.addr, read: true})
	return n, err
}

// TestRebuiltClientWaitsForTheOldClientsRequests rebuilds the client of a
// set while a SET of the old client is pending on a stopped master, and
// checks on the wire that the new client sends nothing before that SET has
// been answered.
func TestRebuiltClientWaitsForTheOldClientsRequests(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &wire{freshIO: make(chan struct{})}
	reg := &Registry{Options: []redlock.Option{
		redlock.WithRedisOptions(func(o *redis.Options) { o.Dialer = w.dial }),
		redlock.WithQuarantine(0), // the servers have just started
	}}
	defer reg.Close()
	ms := &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "locks", UID: "u1", Generation: 1},
		Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: 20 * time.Second},
			// Long enough that only SIGCONT ends the pending SET.
			NodeTimeout: &metav1.Duration{Duration: 10 * time.Second},
			External:    &v1alpha1.ExternalMasters{Addresses: redistest.Addrs(servers)},
		},
		Status: v1alpha1.RedisMasterSetStatus{Addresses: redistest.Addrs(servers)},
	}
	name := types.NamespacedName{Namespace: "ns", Name: "locks"}

	old, err := reg.Client(ctx, ms)
	if err != nil {
		t.Fatalf("first client: %v", err)
	}
	if _, err := old.Probe(ctx); err != nil { // connects to every master
		t.Fatalf("probe: %v", err)
	}
	if err := servers[0].Stop(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = servers[0].Cont() }()
	mark := len(w.log())
	// Two masters grant the lock; the SET to the stopped one stays in flight.
	if _, err := old.Acquire(ctx, "k", 5*time.Second); err != nil {
		t.Fatalf("acquire on the old client: %v", err)
	}

	w.fresh.Store(true)
	rebuilt := ms.DeepCopy()
	rebuilt.Generation = 2
	cancelled, stop := context.WithCancel(ctx)
	stop()
	if c, err := reg.Client(cancelled, rebuilt); err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Client with a cancelled context while the old client's SET is pending = %p, %v; want context.Canceled", c, err)
	}

	type got struct {
		c   *redlock.Client
		err error
	}
	viaClient, viaLookup := make(chan got, 1), make(chan got, 1)
	go func() {
		c, err := reg.Client(ctx, rebuilt)
		if err == nil {
			_, err = c.Probe(ctx)
		}
		viaClient <- got{c, err}
	}()
	go func() {
		c := reg.Lookup(name)
		var err error
		if c != nil {
			_, err = c.Probe(ctx)
		}
		viaLookup <- got{c, err}
	}()
	// While the old SET is pending, the new client must not be handed out:
	// nothing of it may reach the wire within this observation window.
	select {
	case <-w.freshIO:
		t.Fatal("the new client talked to the masters while a request of the old one was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	if err := servers[0].Cont(); err != nil {
		t.Fatal(err)
	}
	a, b := <-viaClient, <-viaLookup
	if a.err != nil || b.err != nil {
		t.Fatalf("new client: via Client %v, via Lookup %v", a.err, b.err)
	}
	if a.c == old || a.c != b.c {
		t.Fatalf("Client and Lookup returned %p and %p, want one new client (the old was %p)", a.c, b.c, old)
	}
	_ = old.Close() // on a broken registry the old client may still be closing

	log := w.log()
	lastOld, firstFresh, pendingAnswered := -1, -1, false
	for i, ev := range log {
		switch {
		case !ev.fresh:
			lastOld = i
			pendingAnswered = pendingAnswered || (i >= mark && ev.read && ev.addr == servers[0].Addr())
		case firstFresh < 0:
			firstFresh = i
		}
	}
	if !pendingAnswered || firstFresh < 0 {
		t.Fatalf("the wire shows no answer to the old client's SET on the stopped master (%v) or no request of the new client (%d): %+v", pendingAnswered, firstFresh, log)
	}
	if firstFresh < lastOld {
		t.Fatalf("the new client's first request (event %d) came before the old client's last I/O (event %d): %+v", firstFresh, lastOld, log)
	}
}

// A membership change builds the joint client, and no view of the set
// older than the newest change (an informer behind the status the set's
// controller wrote) builds a client of an earlier list again.
func TestRegistryFollowsMembershipChangesForwardOnly(t *testing.T) {
	ctx := context.Background()
	a, b := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}, []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:4"}
	name := types.NamespacedName{Namespace: "n", Name: "s"}
	stable := &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name, UID: "u", Generation: 1},
		Spec:       v1alpha1.RedisMasterSetSpec{External: &v1alpha1.ExternalMasters{Addresses: b}, MaxLockTTL: metav1.Duration{Duration: time.Second}},
		Status:     v1alpha1.RedisMasterSetStatus{Addresses: a},
	}
	r := &Registry{}
	defer r.Close()
	unadopted := stable.DeepCopy()
	unadopted.Status.Addresses = nil
	if _, err := r.Client(ctx, unadopted); !errors.Is(err, ErrNotAdopted) {
		t.Fatalf("a set without status.addresses: %v, want ErrNotAdopted (never the spec's list)", err)
	}
	before, err := r.Client(ctx, stable)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.JointFor(name, "other", 1); ok {
		t.Fatal("JointFor a set of another UID: ok")
	}
	if before.Joint() || len(before.Masters()) != 3 || before.Masters()[2].Addr != a[2] {
		t.Fatalf("before the change: a client of %v, want one of status.addresses %v alone", before.Masters(), a)
	}
	changing := stable.DeepCopy()
	changing.Status.Addresses, changing.Status.MembershipEpoch = b, 1
	changing.Status.MembershipChange = &v1alpha1.MembershipChange{Previous: a, Duration: metav1.Duration{Duration: 2 * time.Second}}
	joint, err := r.Client(ctx, changing)
	if err != nil {
		t.Fatal(err)
	}
	if !joint.Joint() {
		t.Fatal("during the change: not a joint client")
	}
	if _, ok := r.JointFor(name, "u", 1); !ok {
		t.Fatal("JointFor the change under way: not ok once its client is handed out")
	}
	if _, ok := r.JointFor(name, "u", 0); ok {
		t.Fatal("JointFor another epoch: ok")
	}
	if c, err := r.Client(ctx, stable); err != nil || c != joint {
		t.Fatalf("a view from before the change: %v (%v), want the joint client kept", c, err)
	}
	ended := changing.DeepCopy()
	ended.Status.MembershipChange, ended.Status.MembershipEpoch = nil, 2
	after, err := r.Client(ctx, ended)
	if err != nil {
		t.Fatal(err)
	}
	if after.Joint() || after == joint {
		t.Fatal("after the change: still the joint client")
	}
	for _, older := range []*v1alpha1.RedisMasterSet{stable, changing} {
		if c, err := r.Client(ctx, older); err != nil || c != after {
			t.Fatalf("a view of epoch %d after the change ended: %v (%v), want the new list's client kept", older.Status.MembershipEpoch, c, err)
		}
	}
}
