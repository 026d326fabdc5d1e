package distributedsemaphore_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// The suite runs the operator in-process against a real kube-apiserver and
// etcd and real redis-server masters (internal/harness/testenv). envtest has
// no kubelet and no scheduler: the tests bind pods and write their status
// (internal/harness/podsim).

var (
	env      *testenv.Env
	k8s      client.Client
	suiteCtx context.Context
)

func TestDistributedSemaphore(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "DistributedSemaphore controller")
}

var _ = BeforeSuite(func() {
	env = testenv.Start()
	k8s, suiteCtx = env.Client, env.Ctx
	Expect(podsim.NodeReady(suiteCtx, k8s, "node-1", corev1.ConditionTrue)).To(Succeed(), "node node-1 to be reported Ready")
})

var _ = AfterSuite(func() { env.Stop() })
