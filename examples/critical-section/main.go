// Command critical-section is an example of pkg/lockclient: it holds a
// DistributedLock for a critical section and writes to a fenced resource
// with the grant's fencing token while the grant lasts.
//
// The fenced resource here is an HTTP endpoint that takes
// POST ?token=N&writer=W and refuses (409) a token lower than the highest
// it has accepted: replace it with your storage's conditional write (a
// column compared in the UPDATE, an object's metadata, a lease epoch).
//
// It prints one line per event, for people and for its test:
//
//	event=granted holder=… token=… at=<unix ns>
//	event=write token=… status=accepted|refused|error sent=<unix ns> at=…
//	event=done reason="…" at=…        (the grant ended: it stops writing)
//	event=released at=…
//
// Usage:
//
//	critical-section -n apps --lock nightly-report --fenced http://127.0.0.1:8080/write --hold 30s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/lockclient"
)

func main() {
	var (
		namespace, lock, fenced, identity string
		hold, every                       time.Duration
	)
	flag.StringVar(&namespace, "n", "default", "namespace of the lock")
	flag.StringVar(&lock, "lock", "", "DistributedLock to hold (it must set spec.holderLease)")
	flag.StringVar(&fenced, "fenced", "", "URL of the fenced resource to write to")
	flag.StringVar(&identity, "identity", "", "prefix of the holder name (default: the host name)")
	flag.DurationVar(&hold, "hold", 10*time.Second, "how long the critical section lasts")
	flag.DurationVar(&every, "every", 100*time.Millisecond, "how often it writes to the fenced resource")
	flag.Parse() // and --kubeconfig, which controller-runtime's config package adds
	if lock == "" || fenced == "" {
		fmt.Fprintln(os.Stderr, "critical-section: --lock and --fenced are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, types.NamespacedName{Namespace: namespace, Name: lock}, fenced, identity, hold, every))
}

func run(ctx context.Context, lock types.NamespacedName, fenced, identity string, hold, every time.Duration) int {
	c, err := newClient()
	if err != nil {
		fmt.Fprintln(os.Stderr, "critical-section:", err)
		return 1
	}
	var opts []lockclient.Option
	if identity != "" {
		opts = append(opts, lockclient.WithIdentity(identity))
	}
	g, err := lockclient.New(c, opts...).Acquire(ctx, lock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "critical-section:", err)
		return 1
	}
	say("granted", "holder", g.Holder, "token", g.Token)
	// Released however the critical section ends: a grant that ended on
	// its own withdraws its request too, but Release says when it is done.
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Release(rctx); err != nil {
			fmt.Fprintln(os.Stderr, "critical-section:", err)
		}
		say("released")
	}()

	end := time.After(hold)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-g.Done():
			say("done", "reason", strconv.Quote(g.Err().Error()))
			return 3
		case <-ctx.Done():
			return 0
		case <-end:
			return 0
		case <-tick.C:
		}
		// Ask before each action: after a pause, this is where the process
		// learns that its grant is over. The token is what protects the
		// resource: a pause can fall between this and the write landing.
		if err := g.Err(); err != nil {
			say("done", "reason", strconv.Quote(err.Error()))
			return 3
		}
		sent := time.Now().UnixNano()
		status := write(ctx, fenced, g)
		say("write", "token", g.Token, "status", status, "sent", sent)
		if status == "refused" {
			// A higher token was accepted: another holder has the lock.
			say("done", "reason", strconv.Quote("the fenced resource refused token "+strconv.FormatInt(g.Token, 10)))
			return 3
		}
	}
}

// write sends one write with the grant's token to the fenced resource.
// It is bounded by the grant's deadline: not sent, or abandoned, past it.
func write(ctx context.Context, fenced string, g *lockclient.Grant) string {
	ctx, cancel := context.WithDeadline(ctx, g.Deadline())
	defer cancel()
	q := url.Values{"token": {strconv.FormatInt(g.Token, 10)}, "writer": {g.Holder}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fenced+"?"+q.Encode(), nil)
	if err != nil {
		return "error"
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "error"
	}
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusConflict {
		return "refused"
	}
	if resp.StatusCode/100 != 2 {
		return "error"
	}
	return "accepted"
}

// newClient connects as --kubeconfig, $KUBECONFIG or in-cluster say.
func newClient() (client.WithWatch, error) {
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, errors.New("register the redlock types")
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: scheme})
}

// say prints one event line.
func say(event string, kv ...any) {
	line := "event=" + event
	for i := 0; i+1 < len(kv); i += 2 {
		line += fmt.Sprintf(" %v=%v", kv[i], kv[i+1])
	}
	fmt.Printf("%s at=%d\n", line, time.Now().UnixNano())
}
