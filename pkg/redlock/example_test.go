package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Example acquires a lock on three independent masters, extends it, and
// releases it. A second client cannot take the lock while it is held.
func Example() {
	// Three real redis-server processes on loopback ports.
	addrs, stop, err := startMasters()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	client, err := redlock.New(addrs, redlock.WithNodeTimeout(50*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	ctx := context.Background()
	lock, err := client.Acquire(ctx, "migrations", 10*time.Second)
	if err != nil {
		fmt.Println("not acquired:", err)
		return
	}
	fmt.Println("held:", lock.Valid())

	// Another process contends for the same key and gives up after one try.
	other, _ := redlock.New(addrs, redlock.WithTries(1))
	defer other.Close()
	_, err = other.Acquire(ctx, "migrations", 10*time.Second)
	fmt.Println("second client:", errors.Is(err, redlock.ErrLockHeld))

	// Work in steps, extending the lock before its validity runs low.
	if err := lock.Extend(ctx); err != nil {
		fmt.Println("lost:", err)
		return
	}
	if err := lock.Release(ctx); err != nil {
		fmt.Println("release:", err)
	}
	fmt.Println("held after release:", lock.Valid())
	// Output:
	// held: true
	// second client: true
	// held after release: false
}

// ExampleClient_AcquireSemaphore admits two holders of one key at once,
// each with a slot and a fencing token of that slot; a third waits, and a
// client declaring another number of slots is refused while they hold.
func ExampleClient_AcquireSemaphore() {
	addrs, stop, err := startMasters()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	client, err := redlock.New(addrs, redlock.WithTries(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	ctx := context.Background()
	var held []*redlock.Lock
	for range 2 {
		l, err := client.AcquireSemaphore(ctx, "reports", 2, 10*time.Second, redlock.WithFencing())
		if err != nil {
			fmt.Println("not acquired:", err)
			return
		}
		defer l.Release(ctx) //nolint:errcheck // the example's end
		held = append(held, l)
	}
	a, _ := held[0].Slot()
	b, _ := held[1].Slot()
	fmt.Println("slots held:", a.Index != b.Index, "tokens:", held[0].Token() > 0 && held[1].Token() > 0)

	_, err = client.AcquireSemaphore(ctx, "reports", 2, 10*time.Second)
	fmt.Println("third holder:", errors.Is(err, redlock.ErrLockHeld))
	_, err = client.AcquireSemaphore(ctx, "reports", 5, 10*time.Second)
	fmt.Println("declared with 5:", errors.Is(err, redlock.ErrSlotsConflict))
	// Output:
	// slots held: true tokens: true
	// third holder: true
	// declared with 5: true
}

// ExampleClient_Notices wakes a waiter in another process when the holder
// releases, rather than after its retry delay.
func ExampleClient_Notices() {
	addrs, stop, err := startMasters()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	ctx := context.Background()

	holder, _ := redlock.New(addrs, redlock.WithReleaseNotices())
	defer holder.Close()
	waiter, _ := redlock.New(addrs, redlock.WithTries(1))
	defer waiter.Close()

	released := make(chan string, 1)
	notices, _ := waiter.Notices(func(key string) { released <- key })
	defer notices.Close()
	// Watch before the attempt: a release after Watch returned is told.
	if err := notices.Watch(ctx, "migrations"); err != nil {
		fmt.Println("no notices, poll instead:", err)
		return
	}

	lock, _ := holder.Acquire(ctx, "migrations", 10*time.Second)
	_, err = waiter.Acquire(ctx, "migrations", 10*time.Second)
	fmt.Println("waiter while held:", errors.Is(err, redlock.ErrLockHeld))

	_ = lock.Release(ctx)
	fmt.Println("told of the release of", <-released)
	won, err := waiter.Acquire(ctx, "migrations", 10*time.Second)
	fmt.Println("waiter once told:", err == nil && won.Valid())
	// Output:
	// waiter while held: true
	// told of the release of migrations
	// waiter once told: true
}

// startMasters starts three redis-server processes for an example.
func startMasters() (addrs []string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "redlock-example-")
	if err != nil {
		return nil, nil, err
	}
	var servers []*redistest.Server
	stop = func() {
		for _, s := range servers {
			_ = s.Close()
		}
		_ = os.RemoveAll(dir)
	}
	for i := range 3 {
		s, err := redistest.Start(filepath.Join(dir, fmt.Sprint(i)), redistest.Options{})
		if err != nil {
			stop()
			return nil, nil, err
		}
		servers = append(servers, s)
		addrs = append(addrs, s.Addr())
	}
	return addrs, stop, nil
}
