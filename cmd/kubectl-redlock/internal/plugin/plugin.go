// Package plugin is the kubectl redlock command line: its cobra commands
// and flags (kubectl's own, from k8s.io/cli-runtime), and the reads and
// writes they make through the API server. What the commands print is
// decided in package report, what a handover does in package handover.
package plugin

import (
	"errors"
	goflag "flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/api/meta"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/version"
)

// Options are what the commands take from their surroundings; the zero
// value is the binary's.
type Options struct {
	// IsTerminal reports whether in is a terminal, which handover's
	// confirmation needs. Default: golang.org/x/term on an *os.File.
	IsTerminal func(in io.Reader) bool
	// PollInterval is how often handover reads the lock while it waits
	// for the next grant. Default: 500ms.
	PollInterval time.Duration
}

func (o *Options) defaults() {
	if o.IsTerminal == nil {
		o.IsTerminal = func(in io.Reader) bool {
			f, ok := in.(*os.File)
			return ok && term.IsTerminal(int(f.Fd()))
		}
	}
	if o.PollInterval == 0 {
		o.PollInterval = 500 * time.Millisecond
	}
}

// cli is what every command shares: the kubeconfig flags, the streams and
// the options.
type cli struct {
	flags   *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	opts    Options
}

// NewCommand returns the kubectl redlock command with its subcommands.
func NewCommand(streams genericiooptions.IOStreams, opts Options) *cobra.Command {
	opts.defaults()
	c := &cli{flags: genericclioptions.NewConfigFlags(true), streams: streams, opts: opts}
	root := &cobra.Command{
		Use:   "kubectl-redlock",
		Short: "Inspect and hand over the DistributedLocks of redlock-operator",
		Long: `kubectl redlock answers questions about the DistributedLocks of redlock-operator
(coordination.redlock.dev/v1alpha1) and the pods that wait for them, from what
the API server shows: who holds a lock and for how long, why a pod is still
gated, who waits, which locks share a Redis key, and a pod's fencing token.
handover hands a lock on, renew renews a static holder's lease and release is
a static holder's own release; they never write status and never touch Redis.
check says whether the operator is installed and answering.`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl redlock"},
		SilenceUsage:  true,
		SilenceErrors: true,
		// --version prints the release the plugin was built as, as the
		// operator's other binaries do; so does the version command.
		Version: version.Version,
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	c.flags.AddFlags(root.PersistentFlags())
	addVerbosity(root.PersistentFlags())
	c.completeFlags(root)
	// The version alone, as the manager, the gate and the agent print it.
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(c.statusCommand(), c.whyCommand(), c.queueCommand(), c.whoCommand(), c.tokenCommand(),
		c.handoverCommand(), c.renewCommand(), c.releaseCommand(), c.checkCommand(), c.versionCommand())
	return root
}

// addVerbosity adds kubectl's -v/--v: client-go's request logs on stderr
// (6: each request and its status, 7: the headers, 8: the bodies).
func addVerbosity(fs *pflag.FlagSet) {
	gofs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gofs)
	v := pflag.PFlagFromGoFlag(gofs.Lookup("v"))
	v.Shorthand = "v"
	v.Usage = "Number for the log level verbosity, as kubectl's: 6 logs each request to the API server, 8 their bodies."
	fs.AddFlag(v)
}

func (c *cli) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version the plugin was built as",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(c.streams.Out, version.Version)
			return err
		},
	}
}

// client returns a client of the cluster the flags name and the namespace
// they choose (-n, or the kubeconfig context's).
func (c *cli) client() (client.Client, string, error) {
	cfg, err := c.flags.ToRESTConfig()
	if err != nil {
		return nil, "", fmt.Errorf("read the kubeconfig: %w", err)
	}
	ns, _, err := c.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("read the namespace from the kubeconfig: %w", err)
	}
	scheme := kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, "", fmt.Errorf("register the Kubernetes types: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, "", fmt.Errorf("register the redlock-operator types: %w", err)
	}
	k, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("connect to the API server: %w", err)
	}
	return k, ns, nil
}

// apiError adds a hint to errors that say the CRDs are missing.
func apiError(what string, err error) error {
	if meta.IsNoMatchError(err) {
		return fmt.Errorf("%s: %w (are redlock-operator's CRDs installed in this cluster?)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// one checks that a command got exactly one argument, named what.
func one(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("%s takes exactly one argument, %s; got %d (see %s --help)", cmd.Name(), what, len(args), cmd.CommandPath())
		}
		return nil
	}
}

// target is the client and namespace to use, and the name of the object
// the command's argument arg names (NAME, or TYPE/NAME with one of types).
func (c *cli) target(arg string, types []string) (k client.Client, ns, objName string, err error) {
	if k, ns, err = c.client(); err != nil {
		return nil, "", "", err
	}
	if objName, err = name(arg, types...); err != nil {
		return nil, "", "", err
	}
	return k, ns, objName, nil
}

// name reads an object's name from the command line: NAME, or TYPE/NAME
// with one of types (as kubectl writes it: pod/web-0, dlock/migrations).
func name(arg string, types ...string) (string, error) {
	t, n, ok := strings.Cut(arg, "/")
	if !ok {
		return arg, nil
	}
	if n != "" && !strings.Contains(n, "/") && slices.Contains(types, strings.ToLower(t)) {
		return n, nil
	}
	return "", fmt.Errorf("%q is not a name: give NAME or %s/NAME", arg, types[0])
}

// Names a command line may give a pod or a lock by.
var (
	podTypes  = []string{"pod", "pods", "po"}
	lockTypes = []string{"distributedlock", "distributedlocks", "dlock", "distributedlock.coordination.redlock.dev"}
	semTypes  = []string{"distributedsemaphore", "distributedsemaphores", "dsem", "distributedsemaphore.coordination.redlock.dev"}
)

// errNotFound wraps the errors for objects named on the command line that
// do not exist.
var errNotFound = errors.New("not found")
