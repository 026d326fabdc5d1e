// Command gate is the entrypoint of every managed Redis container: it keeps
// a master that lost its keys out of service for longer than the longest
// lock TTL, then supervises redis-server. See pkg/gate.
//
//	gate --state-dir /gate/state --restart-delay 32s --persistence None \
//	     --admission-file /gate/podinfo/annotations -- redis-server /etc/redis/redis.conf
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/selfinstall"
	"github.com/redlock-operator/redlock-operator/internal/version"
	"github.com/redlock-operator/redlock-operator/pkg/gate"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "version", "--version": // gate version: the version it was built as
			fmt.Println(version.Version)
			return
		case "install": // gate install DEST: copy this binary (init container)
			if len(os.Args) != 3 {
				fail("usage: gate install DEST")
			}
			if err := selfinstall.Install(os.Args[2]); err != nil {
				fail(err.Error())
			}
			return
		case "probe": // gate probe --port N [--ordinal-env VAR]: is Redis accepting connections?
			probe(os.Args[2:])
			return
		}
	}
	var cfg gate.Config
	var portBase int
	var ordinalEnv string
	var useTLS bool
	flag.StringVar(&cfg.StateDir, "state-dir", "/gate/state", "Directory that outlives container restarts (an emptyDir) for the record of runs.")
	flag.StringVar(&cfg.Persistence, "persistence", gate.PersistenceNone, "Persistence of the master: None, AOFEverySec or AOFAlways.")
	flag.DurationVar(&cfg.RestartDelay, "restart-delay", 0, "How long a master that lost its keys stays out of service (longer than the longest lock TTL plus drift).")
	flag.DurationVar(&cfg.Heartbeat, "heartbeat", time.Second, "How often the record of the run is refreshed while Redis runs (for people reading it).")
	flag.StringVar(&cfg.AdmissionFile, "admission-file", "", "Downward-API annotations file carrying "+gate.AdmissionAnnotation+".")
	flag.DurationVar(&cfg.Poll, "poll", time.Second, "How often the admission file is read while waiting.")
	flag.IntVar(&portBase, "port-base", 0, "With --ordinal-env: append --port BASE+ORDINAL to the command (members on one host network).")
	flag.StringVar(&ordinalEnv, "ordinal-env", "", "Environment variable holding the member's ordinal.")
	flag.BoolVar(&useTLS, "tls", false, "Redis serves TLS only: with --port-base, append --tls-port instead of --port.")
	flag.Parse()
	cfg.Command = flag.Args()
	if portBase > 0 {
		port, err := gate.MemberPort(portBase, ordinalEnv)
		if err != nil {
			fail(err.Error())
		}
		directive := "--port"
		if useTLS {
			directive = "--tls-port"
		}
		cfg.Command = append(cfg.Command, directive, strconv.Itoa(port))
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "gate")
	cfg.Clock = gate.Clock{Wall: wallClock()}

	switch {
	case cfg.RestartDelay <= 0:
		fail("--restart-delay must be positive")
	case cfg.Persistence != gate.PersistenceNone && cfg.Persistence != gate.AOFEverySec && cfg.Persistence != gate.AOFAlways:
		fail("--persistence must be None, AOFEverySec or AOFAlways")
	case len(cfg.Command) == 0:
		fail("usage: gate [flags] -- redis-server [args]")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	code, err := gate.Run(context.Background(), cfg, sigs)
	if err != nil {
		cfg.Log.Error("gate failed", "error", err.Error())
	}
	os.Exit(code)
}

func probe(args []string) {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	port := fs.Int("port", 6379, "Redis port (the base port with --ordinal-env).")
	ordinalEnv := fs.String("ordinal-env", "", "Environment variable holding the member's ordinal, added to --port.")
	timeout := fs.Duration("timeout", time.Second, "Dial timeout.")
	stateDir := fs.String("state-dir", "", "With --voting-after: the gate's state directory.")
	useTLS := fs.Bool("tls", false, "Connect over TLS (Redis serves TLS only).")
	votingAfter := fs.Duration("voting-after", 0, "Report ready only once Redis has run this long: clients quarantine a restarted master for the restart delay, so a rollout waits until the member votes again.")
	_ = fs.Parse(args)
	p, err := gate.MemberPort(*port, *ordinalEnv)
	if err != nil {
		fail(err.Error())
	}
	if err := gate.Probe(fmt.Sprintf("127.0.0.1:%d", p), *timeout, *useTLS); err != nil {
		fail(err.Error())
	}
	if *votingAfter > 0 {
		now, err := gate.Clock{Wall: wallClock()}.Now()
		if err != nil {
			fail(err.Error())
		}
		if err := gate.Voting(*stateDir, *votingAfter, now); err != nil {
			fail(err.Error())
		}
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "gate:", msg)
	os.Exit(2)
}
