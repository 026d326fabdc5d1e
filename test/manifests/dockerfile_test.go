package manifests_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/redlock-operator/redlock-operator/test/dockerfile"
)

const module = "github.com/redlock-operator/redlock-operator"

// The Dockerfile cannot be built here (no container engine), so it is held
// to the Makefile, which is: same binaries, same flags, all sources copied.
var _ = Describe("The Dockerfile", func() {
	var df *dockerfile.File

	BeforeEach(func() {
		f, err := os.Open(filepath.Join(root, "Dockerfile"))
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = f.Close() }()
		df, err = dockerfile.Parse(f)
		Expect(err).NotTo(HaveOccurred())
	})

	It("builds and ships every binary `make build` builds, and runs the manager", func() {
		dirs, err := filepath.Glob(filepath.Join(root, "cmd", "*"))
		Expect(err).NotTo(HaveOccurred())
		var want []string
		for _, d := range dirs {
			want = append(want, "./cmd/"+filepath.Base(d))
		}
		bins, err := df.Binaries()
		Expect(err).NotTo(HaveOccurred())
		var shipped []string
		for _, pkg := range bins {
			shipped = append(shipped, pkg)
		}
		Expect(shipped).To(ConsistOf(want), "the final image holds exactly the cmd/ binaries")
		Expect(df.Entrypoint).To(HaveLen(1))
		Expect(bins).To(HaveKeyWithValue(df.Entrypoint[0], "./cmd/manager"))
		Expect(df.User).To(Equal("65532:65532"), "non-root, as the restricted namespace the manager runs in requires")
	})

	It("builds with the Makefile's flags: static, trimmed, version-stamped, cross-compiled for TARGETOS/TARGETARCH", func() {
		makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
		Expect(err).NotTo(HaveOccurred())
		m := regexp.MustCompile(`(?m)^GO_BUILD := CGO_ENABLED=0 \$\(GO\) build (.*)$`).FindSubmatch(makefile)
		Expect(m).NotTo(BeNil(), "Makefile defines GO_BUILD")
		flags := strings.ReplaceAll(string(m[1]), "$(VERSION)", "${VERSION}")
		Expect(flags).To(ContainSubstring("-X " + module + "/internal/version.Version="))
		for _, b := range df.Builds {
			Expect(b.Flags).To(ContainSubstring("go build "+flags+" -o "), "%s is built as `make build` builds it", b.Package)
		}
		Expect(df.Env).To(ContainSubstring("CGO_ENABLED=0"))
		Expect(df.Env).To(ContainSubstring("GOOS=${TARGETOS"))
		Expect(df.Env).To(ContainSubstring("GOARCH=${TARGETARCH}"))
		Expect(df.BaseImages[0]).To(HavePrefix("FROM --platform=$BUILDPLATFORM "), "the builder cross-compiles instead of running emulated")
	})

	It("copies every top-level directory the binaries' packages live in", func() {
		list := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./cmd/...")
		list.Dir = root
		out, err := list.Output()
		Expect(err).NotTo(HaveOccurred())
		data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
		Expect(err).NotTo(HaveOccurred())
		for _, p := range strings.Fields(string(out)) {
			rest, ok := strings.CutPrefix(p, module+"/")
			if !ok {
				continue
			}
			top, _, _ := strings.Cut(rest, "/")
			Expect(string(data)).To(ContainSubstring("COPY "+top+"/ "+top+"/"), "%s is built from %s/", p, top)
		}
	})
})
