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

// yamlBlocks returns the ```yaml blocks of a Markdown file that hold whole
// objects (apiVersion and kind): the examples a reader applies.
func yamlBlocks(file string) []byte {
	data, err := os.ReadFile(filepath.Join(root, file)) //nolint:gosec // a file of this repository
	Expect(err).NotTo(HaveOccurred())
	var out bytes.Buffer
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(data, -1) {
		if bytes.Contains(block[1], []byte("apiVersion:")) && bytes.Contains(block[1], []byte("kind:")) {
			out.WriteString("---\n")
			out.Write(block[1])
		}
	}
	return out.Bytes()
}

var _ = DescribeTable("every example object in the docs is accepted by the API server",
	func(file string) {
		objs := objects(yamlBlocks(file))
		Expect(objs).NotTo(BeEmpty(), "%s has no example objects", file)
		dryRunApply(objs)
	},
	Entry("docs/active-passive.md", "docs/active-passive.md"),
	Entry("docs/recipes.md", "docs/recipes.md"),
	Entry("README.md", "README.md"),
)
