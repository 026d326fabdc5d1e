package agentaccess_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// The suite runs the operator in-process against a real kube-apiserver and
// etcd (internal/harness/testenv), whose authorizer is RBAC: the specs act as the
// agents' ServiceAccounts by impersonation.

var (
	env      *testenv.Env
	k8s      client.Client
	suiteCtx context.Context
)

func TestAgentAccess(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Agent access controller")
}

var _ = BeforeSuite(func() {
	env = testenv.Start()
	k8s, suiteCtx = env.Client, env.Ctx
})

var _ = AfterSuite(func() { env.Stop() })
