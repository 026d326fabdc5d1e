// Command kubectl-redlock is the kubectl plugin of redlock-operator: with
// the binary on PATH, `kubectl redlock status|why|queue|who|token|handover`
// inspects DistributedLocks and the pods that wait for them, and hands a
// lock on. See docs/tasks/kubectl-plugin.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/plugin"
)

func main() {
	// controller-runtime's client logs nothing a user needs; without a
	// logger it would warn that none was set.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := plugin.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}, plugin.Options{})
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
