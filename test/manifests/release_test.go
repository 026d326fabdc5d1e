package manifests_test

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// testVersion is a version no chart or manifest of the tree carries, with
// a changelog of its own.
const testVersion = "v9.8.7-rc.1"

// release runs hack/release.sh for version into a fresh directory, with a
// changelog that describes testVersion only, without building the plugin
// (the work tree may have changes while the tests run): its output and
// error.
func release(version string) (string, []byte, error) {
	out := GinkgoT().TempDir()
	changelog := filepath.Join(GinkgoT().TempDir(), "CHANGELOG.md")
	Expect(os.WriteFile(changelog, []byte("# Changelog\n\n## ["+testVersion+"] - 2026-12-03\n\n- A test.\n"), 0o600)).To(Succeed())
	cmd := exec.Command("hack/release.sh", version)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "OUT="+out, "CHANGELOG="+changelog, "RELEASE_DIRTY=1", "RELEASE_BINARIES=0", "IMAGE_REPO=registry.example/redlock-operator")
	msg, err := cmd.CombinedOutput()
	return out, msg, err
}

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

// chartFile reads name (e.g. "Chart.yaml") from a packaged chart.
func chartFile(tgz, name string) []byte {
	f, err := os.Open(tgz) //nolint:gosec // the spec's own output
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	z, err := gzip.NewReader(f)
	Expect(err).NotTo(HaveOccurred())
	t := tar.NewReader(z)
	for {
		h, err := t.Next()
		if errors.Is(err, io.EOF) {
			Fail(name + " not in " + tgz)
		}
		Expect(err).NotTo(HaveOccurred())
		if h.Name == "redlock-operator/"+name {
			data, err := io.ReadAll(t)
			Expect(err).NotTo(HaveOccurred())
			return data
		}
	}
}

var _ = Describe("make release", func() {
	It("writes an install.yaml and a packaged chart of the same version that install the same image", func() {
		By("releasing " + testVersion + ", which the changelog has")
		out, msg, err := release(testVersion)
		Expect(err).NotTo(HaveOccurred(), "hack/release.sh %s: %s", testVersion, msg)

		By("install.yaml runs registry.example/redlock-operator:" + testVersion)
		data, err := os.ReadFile(filepath.Join(out, "install.yaml")) //nolint:gosec // the spec's own output
		Expect(err).NotTo(HaveOccurred())
		fromManifests := images(objects(data))
		Expect(fromManifests).To(HaveLen(2), "the manager's image and OPERATOR_IMAGE in install.yaml")
		Expect(fromManifests).To(HaveEach("registry.example/redlock-operator:" + testVersion))

		By("the chart is version 9.8.7-rc.1, appVersion " + testVersion + ", and renders the same image")
		tgz := filepath.Join(out, "redlock-operator-9.8.7-rc.1.tgz")
		var chart struct {
			Version    string `json:"version"`
			AppVersion string `json:"appVersion"`
		}
		Expect(yaml.Unmarshal(chartFile(tgz, "Chart.yaml"), &chart)).To(Succeed())
		Expect(chart.Version).To(Equal("9.8.7-rc.1"))
		Expect(chart.AppVersion).To(Equal(testVersion))
		rendered, err := helmCommand("template", "redlock-operator", tgz, "--namespace", "redlock-system", "--kube-version", serverVersion())
		Expect(err).NotTo(HaveOccurred(), "helm template of the packaged chart: %s", rendered)
		Expect(images(objects(rendered))).To(Equal(fromManifests), "the chart's default image is install.yaml's")
	})

	It("refuses a version that is not vMAJOR.MINOR.PATCH, or that CHANGELOG.md does not describe", func() {
		for version, why := range map[string]string{
			"1.2.3":   "is not vMAJOR.MINOR.PATCH",
			"v1.2":    "is not vMAJOR.MINOR.PATCH",
			"v99.0.0": "has no section '## [v99.0.0]'",
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
