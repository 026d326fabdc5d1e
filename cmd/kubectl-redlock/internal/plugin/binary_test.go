package plugin_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

var _ = Describe("The kubectl-redlock binary", func() {
	It("runs as kubectl's plugin from PATH, prints errors as kubectl does and exits 1 on them", func() {
		dir := GinkgoT().TempDir()
		By("building cmd/kubectl-redlock")
		build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-redlock"), ".")
		build.Dir = filepath.Join(repoRoot(), "cmd", "kubectl-redlock")
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "go build: %s", out)

		ns := namespace("")
		lock := newLock(ns, "jobs", nil)
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) { grant(st, "cron", nil, "g1", 7, 30*time.Second) })

		run := func(name string, args ...string) (string, string, int) {
			cmd := exec.Command(name, args...)
			cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return stdout.String(), stderr.String(), exit.ExitCode()
			}
			Expect(err).NotTo(HaveOccurred())
			return stdout.String(), stderr.String(), 0
		}

		By("running kubectl-redlock status")
		stdout, stderr, code := run(filepath.Join(dir, "kubectl-redlock"), "status", "-n", ns)
		Expect(code).To(BeZero(), "stderr: %s", stderr)
		Expect(stdout).To(MatchRegexp(`^NAMESPACE +NAME +KEY +HOLDER +VALID-FOR +TOKEN +WAITING\n` + ns + ` +jobs +redlock:` + ns + `/jobs +cron +[0-9]+s +7 +0\n$`))

		By("logging each request to the API server with kubectl's -v=6")
		stdout, stderr, code = run(filepath.Join(dir, "kubectl-redlock"), "status", "-n", ns, "-v=6")
		Expect(code).To(BeZero(), "stderr: %s", stderr)
		Expect(stdout).To(ContainSubstring("jobs"))
		Expect(stderr).To(MatchRegexp(`"Response" verb="GET" url="https://[^"]+/apis/coordination.redlock.dev/v1alpha1/namespaces/` + ns + `/distributedlocks" status="200 OK"`))
		_, stderr, _ = run(filepath.Join(dir, "kubectl-redlock"), "status", "-n", ns)
		Expect(stderr).To(BeEmpty(), "no request logs without -v")

		By("running kubectl-redlock queue on a lock that does not exist")
		stdout, stderr, code = run(filepath.Join(dir, "kubectl-redlock"), "queue", "nope", "-n", ns)
		Expect(code).To(Equal(1))
		Expect(stdout).To(BeEmpty())
		Expect(stderr).To(HavePrefix(`error: DistributedLock "nope" not found in namespace ` + ns))

		kubectl, err := exec.LookPath("kubectl")
		if err != nil {
			Skip("no kubectl on PATH: the plugin ran as a binary only")
		}
		By("running kubectl redlock status: kubectl finds the plugin on PATH")
		stdout, stderr, code = run(kubectl, "redlock", "status", "-n", ns, "-o", "json")
		Expect(code).To(BeZero(), "stderr: %s", stderr)
		Expect(stdout).To(ContainSubstring(`"kind": "LockList"`))
		Expect(stdout).To(ContainSubstring(`"identity": "cron"`))

		By("completing through kubectl, which runs kubectl_complete-redlock from PATH")
		script, err := os.ReadFile(filepath.Join(repoRoot(), "cmd", "kubectl-redlock", "kubectl_complete-redlock"))
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(dir, "kubectl_complete-redlock"), script, 0o755)).To(Succeed()) //nolint:gosec // an executable script
		stdout, stderr, code = run(kubectl, "__complete", "redlock", "queue", "-n", ns, "")
		Expect(code).To(BeZero(), "stderr: %s", stderr)
		Expect(stdout).To(HavePrefix("jobs\n"), "the lock's name, then cobra's directive")
	})
})
