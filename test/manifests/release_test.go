package manifests_test

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// testVersion is a version no chart or manifest of the tree carries, with
// a changelog of its own.
const testVersion = "v9.8.7-rc.1"

// releaseEpoch dates every file of the spec's releases (SOURCE_DATE_EPOCH).
var releaseEpoch = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// release runs hack/release.sh for version into a fresh directory, with a
// changelog that describes testVersion only, signed with a key made for
// the spec (the work tree may have changes while the tests run): its
// output and error. The image is built for both platforms; the plugin, to
// fit make test's budget, for linux only (make release builds darwin and
// windows too, with the same code).
func release(version string) (out string, msg []byte, err error) {
	out = GinkgoT().TempDir()
	changelog := filepath.Join(GinkgoT().TempDir(), "CHANGELOG.md")
	Expect(os.WriteFile(changelog, []byte("# Changelog\n\n## ["+testVersion+"] - 2026-12-03\n\n- A test.\n"), 0o600)).To(Succeed())
	cmd := exec.Command("hack/release.sh", version)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "OUT="+out, "CHANGELOG="+changelog, "RELEASE_DIRTY=1", "RELEASE_SIGNING_KEY="+signingKey+".key",
		"IMAGE_REPO=registry.example/redlock-operator", "PLUGIN_PLATFORMS=linux/amd64,linux/arm64", fmt.Sprintf("SOURCE_DATE_EPOCH=%d", releaseEpoch.Unix()))
	msg, err = cmd.CombinedOutput()
	return out, msg, err
}

// signingKey is the key pair (.key, .pub) the specs sign with.
var signingKey = func() string {
	dir, err := os.MkdirTemp("", "release-key")
	if err != nil {
		panic(err)
	}
	return filepath.Join(dir, "test")
}()

// images are the container images and OPERATOR_IMAGE values of the
// manager's Deployment among objs.
func images(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, u := range objs {
		if u.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			c := c.(map[string]any)
			out = append(out, c["image"].(string))
			env, _, _ := unstructured.NestedSlice(c, "env")
			for _, e := range env {
				if e := e.(map[string]any); e["name"] == "OPERATOR_IMAGE" {
					out = append(out, e["value"].(string))
				}
			}
		}
	}
	return out
}

// chartEntries calls each with every entry of a packaged chart, in order,
// until it returns false.
func chartEntries(tgz string, each func(*tar.Header, io.Reader) bool) {
	f, err := os.Open(tgz) //nolint:gosec // the spec's own output
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	z, err := gzip.NewReader(f)
	Expect(err).NotTo(HaveOccurred())
	t := tar.NewReader(z)
	for {
		h, err := t.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		Expect(err).NotTo(HaveOccurred())
		if !each(h, t) {
			return
		}
	}
}

// chartTimes are the modification times of a packaged chart's files.
func chartTimes(tgz string) []time.Time {
	var out []time.Time
	chartEntries(tgz, func(h *tar.Header, _ io.Reader) bool {
		out = append(out, h.ModTime)
		return true
	})
	return out
}

// chartFile reads name (e.g. "Chart.yaml") from a packaged chart.
func chartFile(tgz, name string) []byte {
	var data []byte
	found := false
	chartEntries(tgz, func(h *tar.Header, r io.Reader) bool {
		if h.Name != "redlock-operator/"+name {
			return true
		}
		var err error
		data, err = io.ReadAll(r)
		Expect(err).NotTo(HaveOccurred())
		found = true
		return false
	})
	Expect(found).To(BeTrue(), "%s in %s", name, tgz)
	return data
}

var _ = Describe("make release", func() {
	It("writes a signed release: the image for two platforms with SBOMs, install.yaml and the chart by its digest, plugin archives with a krew manifest", func() {
		By("making a signing key")
		tool(filepath.Join(root, "hack", "release"), "go", "run", ".", "keygen", "-out", signingKey)

		By("releasing " + testVersion + ", which the changelog has")
		out, msg, err := release(testVersion)
		Expect(err).NotTo(HaveOccurred(), "hack/release.sh %s: %s", testVersion, msg)

		By("the OCI layout holds one index of linux/amd64 and linux/arm64 images with the four binaries, stamped " + testVersion)
		digest := strings.TrimSpace(string(read(out, "image.digest")))
		checkImage(filepath.Join(out, "image"), digest, testVersion)

		By("each platform's SBOM lists the image's binaries and the modules each was built from")
		for _, arch := range []string{"amd64", "arm64"} {
			checkSBOM(filepath.Join(out, "redlock-operator-linux-"+arch+".spdx.json"), testVersion)
		}

		By("install.yaml runs registry.example/redlock-operator@" + digest)
		image := "registry.example/redlock-operator@" + digest
		fromManifests := images(objects(read(out, "install.yaml")))
		Expect(fromManifests).To(HaveLen(2), "the manager's image and OPERATOR_IMAGE in install.yaml")
		Expect(fromManifests).To(HaveEach(image))

		By("the chart is version 9.8.7-rc.1, appVersion " + testVersion + ", and renders the same image")
		tgz := filepath.Join(out, "redlock-operator-9.8.7-rc.1.tgz")
		var chart struct {
			Version    string `json:"version"`
			AppVersion string `json:"appVersion"`
		}
		Expect(yaml.Unmarshal(chartFile(tgz, "Chart.yaml"), &chart)).To(Succeed())
		Expect(chart.Version).To(Equal("9.8.7-rc.1"))
		Expect(chart.AppVersion).To(Equal(testVersion))
		Expect(chartTimes(tgz)).To(HaveEach(BeTemporally("==", releaseEpoch)), "every file of the chart dated SOURCE_DATE_EPOCH, so that two releases of a commit give one chart")
		info, err := os.Stat(tgz)
		Expect(err).NotTo(HaveOccurred())
		Expect(info.ModTime()).To(BeTemporally("==", releaseEpoch), "the chart archive dated SOURCE_DATE_EPOCH too: helm push dates the chart's OCI manifest by it")
		rendered, err := helmCommand("template", "redlock-operator", tgz, "--namespace", "redlock-system", "--kube-version", serverVersion())
		Expect(err).NotTo(HaveOccurred(), "helm template of the packaged chart: %s", rendered)
		Expect(images(objects(rendered))).To(Equal(fromManifests), "the chart's default image is install.yaml's")

		By("the krew manifest passes krew's validation, and krew installs the plugin from this platform's archive")
		krew := filepath.Join(root, "hack", "tools", "krew")
		tool(krew, "go", "tool", "validate-krew-manifest", "-skip-install", "-manifest", filepath.Join(out, "redlock.yaml"))
		bin := GinkgoT().TempDir()
		tool(krew, "go", "build", "-o", filepath.Join(bin, "kubectl-krew"), "sigs.k8s.io/krew/cmd/krew")
		krewRoot := GinkgoT().TempDir()
		install := exec.Command(filepath.Join(bin, "kubectl-krew"), "install", "--manifest="+filepath.Join(out, "redlock.yaml"),
			"--archive="+filepath.Join(out, "kubectl-redlock_"+testVersion+"_linux_"+runtime.GOARCH+".tar.gz"))
		install.Env = append(os.Environ(), "KREW_ROOT="+krewRoot)
		msg, err = install.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "krew install: %s", msg)
		version, err := exec.Command(filepath.Join(krewRoot, "bin", "kubectl-redlock"), "version").Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(version)).To(Equal(testVersion+"\n"), "the plugin krew installed is the release's")

		By("SHA256SUMS lists every file with its checksum, and its signature verifies with the public key")
		sums := read(out, "SHA256SUMS")
		checkSums(out, sums)
		pub := read(signingKey + ".pub")
		sig := read(out, "SHA256SUMS.sig")
		Expect(verify(pub, sums, sig)).To(BeTrue(), "SHA256SUMS.sig verifies")
		Expect(verify(pub, append(sums, '\n'), sig)).To(BeFalse(), "a changed SHA256SUMS does not verify")
	})

	It("refuses a version that is not vMAJOR.MINOR.PATCH, that CHANGELOG.md does not describe, or a signed development build", func() {
		for version, why := range map[string]string{
			"1.2.3":   "is not vMAJOR.MINOR.PATCH",
			"v1.2":    "is not vMAJOR.MINOR.PATCH",
			"v99.0.0": "has no section '## [v99.0.0]'",
			// Signed (the spec's key): a development build is never published.
			"v1.2.3-dev+0123abc": "is a development build",
			"v1.2.3+0123abc":     "is a development build",
		} {
			out, msg, err := release(version)
			Expect(err).To(HaveOccurred(), "release %s refused", version)
			Expect(string(msg)).To(ContainSubstring(why), "release %s", version)
			entries, err := os.ReadDir(out)
			Expect(err).NotTo(HaveOccurred())
			Expect(entries).To(BeEmpty(), "release %s wrote nothing", version)
		}
	})
})
