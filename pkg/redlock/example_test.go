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
	dir, _ := os.MkdirTemp("", "redlock-example-")
	defer os.RemoveAll(dir)
	var addrs []string
	for i := range 3 {
		s, err := redistest.Start(filepath.Join(dir, fmt.Sprint(i)), redistest.Options{})
		if err != nil {
			fmt.Println(err)
			return
		}
		defer s.Close()
		addrs = append(addrs, s.Addr())
	}

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
