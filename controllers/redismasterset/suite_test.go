package redismasterset_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// The suite runs the operator in-process against a real kube-apiserver and
// etcd and real redis-server masters (internal/harness/testenv).

// maxLockTTL of the test master sets: short, so that the quarantine of a
// restarted master (maxLockTTL + drift + 1s) passes quickly.
const maxLockTTL = 2 * time.Second

var (
	env      *testenv.Env
	k8s      client.Client
	suiteCtx context.Context
)

func TestRedisMasterSet(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "RedisMasterSet controller")
}

var _ = BeforeSuite(func() {
	env = testenv.Start()
	k8s, suiteCtx = env.Client, env.Ctx
})

var _ = AfterSuite(func() { env.Stop() })

func startManager() *testenv.Manager { return env.StartManager() }

func newNamespace() string { return env.NewNamespace() }

func eventReasons(ns, name string) []string { return env.EventReasons(ns, name) }
