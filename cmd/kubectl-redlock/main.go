// Command kubectl-redlock is the kubectl plugin of redlock-operator: with
// the binary on PATH, `kubectl redlock status|why|queue|who|token` inspects
// DistributedLocks and DistributedSemaphores and the pods that wait for
// them, `handover|renew|release` hands a lock on, and `check` says whether
// the operator answers. See docs/tasks/kubectl-plugin.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/plugin"
)

func main() {
	// controller-runtime's client logs through klog, as client-go does:
	// -v shows both.
	ctrllog.SetLogger(klog.NewKlogr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := plugin.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}, plugin.Options{})
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
