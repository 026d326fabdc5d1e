package podgate_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// The suite runs the operator in-process against a real kube-apiserver and
// etcd and real redis-server masters (internal/harness/testenv). envtest has no
// kubelet and no scheduler: the tests bind pods and write their status.

var (
	env      *testenv.Env
	k8s      client.Client
	suiteCtx context.Context
)

func TestPodGate(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Pod gate controller")
}

var _ = BeforeSuite(func() {
	env = testenv.Start()
	k8s, suiteCtx = env.Client, env.Ctx
	setNodeReady("node-1", corev1.ConditionTrue) // where kubeletRuns binds pods
})

var _ = AfterSuite(func() { env.Stop() })
