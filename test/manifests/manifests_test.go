// Package manifests_test applies every manifest the project ships —
// dist/install.yaml and the kustomize output of each directory under
// config/ — to a real kube-apiserver (envtest) with a server-side dry run,
// so that a field the API server refuses (a typo, a wrong scope, CEL that
// does not compile) fails here rather than in a user's cluster.
package manifests_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

var (
	env  *testenv.Env
	root = func() string { _, f, _, _ := runtime.Caller(0); return filepath.Join(filepath.Dir(f), "..", "..") }()
)

func TestManifests(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Shipped manifests")
}

var _ = BeforeSuite(func() { env = testenv.Start() })

var _ = AfterSuite(func() { env.Stop() })

// kustomize builds dir (relative to the repository) with the pinned tool.
func kustomize(dir string) []byte {
	cmd := exec.Command("go", "tool", "-modfile=hack/tools/go.mod", "kustomize", "build", dir)
	cmd.Dir = root
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	Expect(cmd.Run()).To(Succeed(), "kustomize build %s: %s", dir, errOut.String())
	return out.Bytes()
}

// objects splits a multi-document YAML stream.
func objects(data []byte) []*unstructured.Unstructured {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// dryRunApply applies objs with a server-side dry run; namespaces they
// need are created for real first (a dry run cannot create into a
// namespace that does not exist). Namespaced objects without a namespace
// (samples, applied into the user's current namespace) go into a fresh one.
func dryRunApply(objs []*unstructured.Unstructured) {
	k8s, ctx := env.Client, env.Ctx
	current := env.NewNamespace()
	for _, u := range objs {
		namespaced, err := k8s.IsObjectNamespaced(u)
		Expect(err).NotTo(HaveOccurred(), "%s: unknown kind", u.GetKind())
		if namespaced && u.GetNamespace() == "" {
			u.SetNamespace(current)
		}
		if ns := u.GetNamespace(); ns != "" && u.GetKind() != "Namespace" {
			err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metaName(ns)})
			Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "create namespace %s: %v", ns, err)
		}
	}
	for _, u := range objs {
		err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.DryRunAll, client.ForceOwnership, client.FieldOwner("manifest-test"))
		Expect(err).NotTo(HaveOccurred(), "%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
	}
}

var _ = DescribeTable("every shipped manifest is accepted by the API server",
	func(load func() []byte) {
		objs := objects(load())
		Expect(objs).NotTo(BeEmpty())
		dryRunApply(objs)
	},
	Entry("dist/install.yaml", func() []byte {
		data, err := os.ReadFile(filepath.Join(root, "dist", "install.yaml")) //nolint:gosec // a file of this repository
		Expect(err).NotTo(HaveOccurred(), "run make build-installer")
		return data
	}),
	Entry("config/default", func() []byte { return kustomize("config/default") }),
	Entry("config/samples", func() []byte { return kustomize("config/samples") }),
	Entry("config/e2e", func() []byte { return kustomize("config/e2e") }),
	Entry("config/crd", func() []byte { return kustomize("config/crd") }),
	Entry("config/rbac", func() []byte { return kustomize("config/rbac") }),
	Entry("config/webhook", func() []byte { return kustomize("config/webhook") }),
	Entry("config/admission-policy", func() []byte { return kustomize("config/admission-policy") }),
	Entry("config/network-policy", func() []byte { return kustomize("config/network-policy") }),
	Entry("config/watch-namespaces", func() []byte { return kustomize("config/watch-namespaces") }),
)

func metaName(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }

// exampleBlock is a fenced block of a Markdown file: a ```yaml block, or
// the YAML a ```sh block feeds kubectl apply through a here-document.
var (
	fencedBlock = regexp.MustCompile("(?s)```([a-z]*)\n(.*?)```")
	hereDoc     = regexp.MustCompile(`(?s)<<-?'?EOF'?\n(.*?)\nEOF`)
	wholeObject = regexp.MustCompile(`(?m)^apiVersion: .*$[\s\S]*^kind: |(?m)^kind: .*$[\s\S]*^apiVersion: `)
)

// yamlBlocks returns the YAML examples of a Markdown file that hold whole
// objects (apiVersion and kind at the top level): the examples a reader
// applies. Blocks that are fragments (a spec, a pod template's part) must
// not carry both. It fails on a block of another language that holds a
// whole object outside a here-document, which no test would apply.
func yamlBlocks(file string) []byte {
	data, err := os.ReadFile(filepath.Join(root, file)) //nolint:gosec // a file of this repository
	Expect(err).NotTo(HaveOccurred())
	var out bytes.Buffer
	add := func(block []byte) {
		for doc := range bytes.SplitSeq(block, []byte("\n---\n")) {
			if wholeObject.Match(doc) {
				out.WriteString("---\n")
				out.Write(doc)
				out.WriteString("\n")
			}
		}
	}
	for _, block := range fencedBlock.FindAllSubmatch(data, -1) {
		switch lang, body := string(block[1]), block[2]; lang {
		case "yaml":
			add(body)
		case "sh":
			for _, doc := range hereDoc.FindAllSubmatch(body, -1) {
				add(doc[1])
			}
		default:
			Expect(wholeObject.Match(withoutReports(body))).To(BeFalse(),
				"%s: a ```%s block holds a Kubernetes object: make it a ```yaml block, so that it is applied", file, lang)
		}
	}
	return out.Bytes()
}

// pagesWithExamples are README.md and every page under docs/ (but the
// generated ones) with at least one example object: found by walking the
// tree, so that a new page cannot be forgotten.
func pagesWithExamples() []string {
	pages, err := listDocPages()
	if err != nil {
		panic(err)
	}
	var out []string
	for _, page := range pages {
		if slices.Contains(generatedPages, page) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, page)) //nolint:gosec // a file of this repository
		if err != nil {
			panic(err)
		}
		if wholeObject.Match(withoutReports(data)) {
			out = append(out, page)
		}
	}
	return out
}

// withoutReports is data without the apiVersion of kubectl redlock's
// documents (report.redlock.dev), which no API server serves: shown on
// the plugin's page, never applied.
func withoutReports(data []byte) []byte {
	return bytes.ReplaceAll(data, []byte("apiVersion: report.redlock.dev/v1alpha1"), nil)
}

var _ = Describe("every example object in the docs is accepted by the API server", func() {
	pages := pagesWithExamples()
	It("covers README.md and the pages of docs/ that hold examples", func() {
		Expect(pages).To(ContainElements("README.md", "docs/tasks/jobs.md", "docs/tasks/semaphores.md", "docs/tasks/deployments.md", "docs/tasks/statefulsets.md"))
		Expect(len(pages)).To(BeNumerically(">=", 10), "pages with example objects: %v", pages)
	})
	for _, page := range pages {
		It("applies the examples of "+page, func() {
			objs := objects(yamlBlocks(page))
			Expect(objs).NotTo(BeEmpty(), "%s names apiVersion and kind outside a ```yaml block or here-document", page)
			dryRunApply(objs)
		})
	}
})
