package manifests_test

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/pmezard/go-difflib/difflib"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	previousrelease "github.com/redlock-operator/redlock-operator/internal/harness/release"
)

// The chart at charts/redlock-operator must install what config/default
// installs (dist/install.yaml): the same objects under the same names, so
// that either can be used and neither drifts. Its RBAC, CRDs and other
// copied parts are synced by `make helm-chart` (checked by `make verify`);
// its hand-written templates (the Deployment, the metrics Service, the
// ServiceMonitor) are held to the kustomize output here.
const chartDir = "charts/redlock-operator"

// helmLabels are the labels the chart adds to the metadata of every object
// it templates and kustomize does not have: they name the chart, the tool,
// the release and the app version, which only exist for a Helm release.
// They are dropped from the chart's side only (from metadata.labels, not
// from selectors or pod templates, where the chart adds none), so a label
// kustomize gained would still show as a difference.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

var _ = Describe("The Helm chart", func() {
	// The values under which the chart must equal config/default: its
	// namespace, rendered as an object as config/default does, and the
	// image config/manager sets.
	defaults := []string{"namespace.create=true", "image.tag=dev"}

	It("renders the objects of kustomize build config/default", func() {
		expectSameObjects(helmTemplate("redlock-system", defaults...), kustomize("config/default"), "config/default")
	})

	It("renders the ServiceMonitor and the PrometheusRule of config/prometheus with metrics.serviceMonitor.enabled and metrics.prometheusRule.enabled", func() {
		// config/default with its ../prometheus line uncommented, as its
		// comment tells users to do.
		dir := GinkgoT().TempDir()
		Expect(os.CopyFS(filepath.Join(dir, "config"), os.DirFS(filepath.Join(root, "config")))).To(Succeed())
		k := filepath.Join(dir, "config", "default", "kustomization.yaml")
		data, err := os.ReadFile(k) //nolint:gosec // a copy of this repository's file
		Expect(err).NotTo(HaveOccurred())
		Expect(string(data)).To(ContainSubstring("\n#- ../prometheus\n"))
		Expect(os.WriteFile(k, bytes.Replace(data, []byte("\n#- ../prometheus\n"), []byte("\n- ../prometheus\n"), 1), 0o600)).To(Succeed())
		want := kustomize(filepath.Join(dir, "config", "default"))
		Expect(kinds(objects(want))).To(ContainElements("ServiceMonitor", "PrometheusRule"))
		expectSameObjects(helmTemplate("redlock-system", append(defaults, "metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true")...), want, "config/default with config/prometheus")
	})

	It("renders the objects of kustomize build config/watch-namespaces with watchNamespaces, which the API server accepts", func() {
		// config/watch-namespaces/namespaces lists team-a and team-b.
		out := helmTemplate("redlock-system", append(defaults, "watchNamespaces={team-a,team-b}")...)
		expectSameObjects(out, kustomize("config/watch-namespaces"), "config/watch-namespaces")
		dryRunApply(objects(out))

		By("refusing a namespace name Kubernetes would refuse")
		out, err := helmTemplateErr("redlock-system", "image.tag=dev", "watchNamespaces={Team_A}")
		Expect(err).To(HaveOccurred(), "rendered:\n%s", out)
		Expect(string(out)).To(ContainSubstring(`watchNamespaces: "Team_A" is not a namespace name`))
	})

	It("refuses values of the wrong type or names it does not know (values.schema.json), saying which", func() {
		for set, says := range map[string]string{
			"replicas=abc":                           "/replicas",
			"replica=2":                              "'replica' not allowed",
			"metrics.port=0":                         "/metrics/port",
			"leaderElection.leaseDuration=15":        "/leaderElection/leaseDuration",
			"image.pullPolicy=Sometimes":             "/image/pullPolicy",
			"webhook.enabled=yes-please":             "/webhook/enabled",
			"webhook.timeoutSeconds=31":              "/webhook/timeoutSeconds",
			"serviceAccount.annotation.a=b":          "'annotation' not allowed",
			"extraVolumeMounts[0].name=a":            "/extraVolumeMounts/0",
			"topologySpreadConstraints[0].maxSkew=1": "/topologySpreadConstraints/0",
		} {
			out, err := helmTemplateErr("redlock-system", "image.tag=dev", set)
			Expect(err).To(HaveOccurred(), "--set %s rendered:\n%s", set, out)
			Expect(string(out)).To(ContainSubstring(says), "--set %s", set)
		}
	})

	It("says in its notes which namespaces the release serves", func() {
		// A client-side dry run: nothing is installed, and objects other
		// specs left under the same names are no conflict.
		kubeconfig := env.Kubeconfig(GinkgoT().TempDir())
		out, err := helmCommand("install", "redlock-operator", chartDir, "--dry-run=client", "--take-ownership", "--namespace", "redlock-system", "--kubeconfig", kubeconfig,
			"--set", "image.tag=dev", "--set", "watchNamespaces={team-a,team-b}")
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		Expect(string(out)).To(ContainSubstring("namespaces team-a, team-b only"))
		Expect(string(out)).NotTo(ContainSubstring("labelled pods in all namespaces"))
		out, err = helmCommand("install", "redlock-operator", chartDir, "--dry-run=client", "--take-ownership", "--namespace", "redlock-system", "--kubeconfig", kubeconfig,
			"--set", "image.tag=dev")
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		Expect(string(out)).To(ContainSubstring("labelled pods in all namespaces"))
	})

	It("is accepted by the API server with the default values", func() {
		objs := objects(helmTemplate("redlock-system", defaults...))
		Expect(objs).NotTo(BeEmpty())
		dryRunApply(objs)
	})

	It("names a development build (appVersion v0.2.0-dev+SHA, as make e2e-release packages it) in labels and an image tag the API server accepts", func() {
		dir := filepath.Join(GinkgoT().TempDir(), "redlock-operator")
		Expect(os.CopyFS(dir, os.DirFS(filepath.Join(root, chartDir)))).To(Succeed())
		meta := filepath.Join(dir, "Chart.yaml")
		data, err := os.ReadFile(meta) //nolint:gosec // the spec's own copy
		Expect(err).NotTo(HaveOccurred())
		data = regexp.MustCompile(`(?m)^appVersion: .*$`).ReplaceAll(data, []byte(`appVersion: "v0.2.0-dev+0123456789ab.dirty"`))
		Expect(os.WriteFile(meta, data, 0o600)).To(Succeed())
		out, err := helmCommand("template", "redlock-operator", dir, "--namespace", "redlock-system", "--include-crds", "--kube-version", serverVersion(), "--set", "namespace.create=true")
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		objs := objects(out)
		Expect(images(objs)).To(HaveEach("redlock-operator:v0.2.0-dev_0123456789ab.dirty"), "the tag is the version with + written _, as the release's OCI layout names it")
		for _, u := range objs {
			Expect(u.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/version", "v0.2.0-dev_0123456789ab.dirty"), "%s %s", u.GetKind(), u.GetName())
		}
		dryRunApply(objs)
	})

	It("follows the values: another namespace, no webhook, no metrics, one replica without leader election, no budget, priority class or anti-affinity", func() {
		const ns = "locks-operator"
		out := helmTemplate(ns, "namespace.create=true", "image.tag=dev", "webhook.enabled=false",
			"metrics.enabled=false", "replicas=1", "leaderElection.enabled=false",
			"podDisruptionBudget.enabled=false", "priorityClass.create=false", "priorityClassName=", "affinity=null")
		Expect(string(out)).NotTo(ContainSubstring("redlock-system"), "nothing refers to config/default's namespace")
		objs := objects(out)

		byKind := map[string][]*unstructured.Unstructured{}
		for _, u := range objs {
			byKind[u.GetKind()] = append(byKind[u.GetKind()], u)
			namespaced, err := env.Client.IsObjectNamespaced(u)
			Expect(err).NotTo(HaveOccurred(), "%s: unknown kind", u.GetKind())
			if namespaced {
				Expect(u.GetNamespace()).To(Equal(ns), "%s %s", u.GetKind(), u.GetName())
			} else {
				Expect(u.GetNamespace()).To(BeEmpty(), "%s %s is cluster-scoped", u.GetKind(), u.GetName())
			}
		}
		Expect(byKind).NotTo(HaveKey("MutatingWebhookConfiguration"))
		Expect(byKind).To(HaveKey("ValidatingAdmissionPolicy"), "the admission policy does not need the webhook")
		Expect(byKind["Namespace"]).To(HaveLen(1))
		Expect(byKind["Namespace"][0].GetName()).To(Equal(ns))
		Expect(byKind["Namespace"][0].GetLabels()).To(HaveKeyWithValue("pod-security.kubernetes.io/enforce", "restricted"))
		Expect(names(byKind["Service"])).To(BeEmpty(), "neither the webhook's nor the metrics Service")
		Expect(names(byKind["Secret"])).To(BeEmpty(), "no webhook certificate Secret")
		Expect(byKind).NotTo(HaveKey("PodDisruptionBudget"))
		Expect(byKind).NotTo(HaveKey("PriorityClass"))
		Expect(names(byKind["ClusterRoleBinding"])).To(ConsistOf("/redlock-operator-manager-rolebinding", "/redlock-operator-node-reader-rolebinding"),
			"no cluster-wide rules for the metrics endpoint or the webhook's CA bundle, both off")

		Expect(byKind["Deployment"]).To(HaveLen(1))
		deploy := byKind["Deployment"][0]
		Expect(deploy.GetNamespace()).To(Equal(ns))
		replicas, _, _ := unstructured.NestedFieldNoCopy(deploy.Object, "spec", "replicas")
		Expect(replicas).To(BeNumerically("==", 1))
		containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
		Expect(containers).To(HaveLen(1))
		manager := containers[0].(map[string]any)
		args, _, _ := unstructured.NestedStringSlice(manager, "args")
		Expect(args).To(ContainElements("--enable-webhook=false", "--metrics-bind-address=0", "--leader-elect=false"))
		Expect(args).NotTo(ContainElement("--leader-elect"))
		Expect(args).NotTo(ContainElement(HavePrefix("--metrics-bind-address=:")))
		ports, _, _ := unstructured.NestedSlice(manager, "ports")
		Expect(ports).To(ConsistOf(HaveKeyWithValue("name", "probes")), "only the probes listen")
		Expect(manager).NotTo(HaveKey("volumeMounts"), "no webhook certificate to mount")
		volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
		Expect(volumes).To(BeEmpty())
		podSpec, _, _ := unstructured.NestedMap(deploy.Object, "spec", "template", "spec")
		Expect(podSpec).NotTo(HaveKey("priorityClassName"), "the cluster's default priority")
		Expect(podSpec).NotTo(HaveKey("affinity"), "affinity=null drops the default anti-affinity")

		bindings := append(byKind["RoleBinding"], byKind["ClusterRoleBinding"]...)
		Expect(bindings).NotTo(BeEmpty())
		for _, b := range bindings {
			subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
			Expect(subjects).To(ConsistOf(And(
				HaveKeyWithValue("kind", "ServiceAccount"),
				HaveKeyWithValue("name", "redlock-operator-controller-manager"),
				HaveKeyWithValue("namespace", ns),
			)), "%s %s binds the manager's ServiceAccount in %s", b.GetKind(), b.GetName(), ns)
		}
		Expect(names(byKind["ServiceAccount"])).To(ConsistOf(ns + "/redlock-operator-controller-manager"))

		dryRunApply(objs)
	})

	It("adds what the values add: volumes and their mounts, topology spread, the webhooks' timeout, the ServiceAccount's annotations", func() {
		vals := []string{"namespace.create=true", "image.tag=dev", "webhook.timeoutSeconds=5",
			"serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=locks@example.iam.gserviceaccount.com",
			"extraVolumes[0].name=ca-bundle", "extraVolumes[0].configMap.name=ca-bundle",
			"extraVolumeMounts[0].name=ca-bundle", "extraVolumeMounts[0].mountPath=/etc/ca-bundle", "extraVolumeMounts[0].readOnly=true",
			"topologySpreadConstraints[0].maxSkew=1", "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
			"topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
			"topologySpreadConstraints[0].labelSelector.matchLabels.control-plane=controller-manager"}
		objs := objects(helmTemplate("redlock-system", vals...))
		byKind := map[string][]*unstructured.Unstructured{}
		for _, u := range objs {
			byKind[u.GetKind()] = append(byKind[u.GetKind()], u)
		}

		By("the ServiceAccount carries the annotation")
		Expect(byKind["ServiceAccount"]).To(HaveLen(1))
		Expect(byKind["ServiceAccount"][0].GetAnnotations()).To(Equal(map[string]string{"iam.gke.io/gcp-service-account": "locks@example.iam.gserviceaccount.com"}))

		By("both webhooks time out after 5 seconds")
		Expect(byKind["MutatingWebhookConfiguration"]).To(HaveLen(1))
		hooks, _, _ := unstructured.NestedSlice(byKind["MutatingWebhookConfiguration"][0].Object, "webhooks")
		Expect(hooks).To(HaveLen(2))
		Expect(hooks).To(HaveEach(HaveKeyWithValue("timeoutSeconds", BeNumerically("==", 5))))

		By("the manager's pods mount the volume beside the webhook's certificate and spread across zones")
		deploy := byKind["Deployment"][0]
		volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
		Expect(volumes).To(HaveLen(3))
		Expect(volumes[0]).To(HaveKeyWithValue("name", "webhook-certs"))
		Expect(volumes[1]).To(HaveKeyWithValue("name", "metrics-certs"))
		Expect(volumes[2]).To(Equal(map[string]any{"name": "ca-bundle", "configMap": map[string]any{"name": "ca-bundle"}}))
		containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
		mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
		Expect(mounts).To(HaveLen(3))
		Expect(mounts[2]).To(Equal(map[string]any{"name": "ca-bundle", "mountPath": "/etc/ca-bundle", "readOnly": true}))
		spread, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "topologySpreadConstraints")
		Expect(spread).To(HaveLen(1))
		Expect(spread[0]).To(HaveKeyWithValue("topologyKey", "topology.kubernetes.io/zone"))
		dryRunApply(objs)

		By("over plain HTTP (metrics.secure=false), no metrics certificate: no Secret, no flags")
		for _, u := range objects(helmTemplate("redlock-system", "image.tag=dev", "metrics.secure=false")) {
			Expect(u.GetName()).NotTo(Equal("redlock-operator-metrics-server-cert"), "%s %s", u.GetKind(), u.GetName())
			if u.GetKind() == "Deployment" {
				containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
				args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
				Expect(args).NotTo(ContainElement(HavePrefix("--metrics-secret-name")))
			}
		}

		By("without the webhook and the metrics endpoint, the extra volume alone")
		objs = objects(helmTemplate("redlock-system", append(vals, "webhook.enabled=false", "metrics.enabled=false")...))
		for _, u := range objs {
			if u.GetKind() != "Deployment" {
				continue
			}
			volumes, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
			Expect(volumes).To(ConsistOf(HaveKeyWithValue("name", "ca-bundle")))
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
			Expect(mounts).To(ConsistOf(HaveKeyWithValue("name", "ca-bundle")))
		}
	})

	It("keeps the manager available: a budget only with more than one replica, a priority class only when it exists", func() {
		byKind := func(out []byte) map[string][]*unstructured.Unstructured {
			m := map[string][]*unstructured.Unstructured{}
			for _, u := range objects(out) {
				m[u.GetKind()] = append(m[u.GetKind()], u)
			}
			return m
		}
		podSpec := func(objs map[string][]*unstructured.Unstructured) map[string]any {
			Expect(objs["Deployment"]).To(HaveLen(1))
			spec, _, _ := unstructured.NestedMap(objs["Deployment"][0].Object, "spec", "template", "spec")
			return spec
		}

		By("the defaults: a budget of minAvailable 1, the chart's PriorityClass, anti-affinity across nodes")
		objs := byKind(helmTemplate("redlock-system", "image.tag=dev"))
		Expect(names(objs["PodDisruptionBudget"])).To(ConsistOf("redlock-system/redlock-operator-controller-manager"))
		Expect(names(objs["PriorityClass"])).To(ConsistOf("/redlock-operator-critical"))
		Expect(podSpec(objs)).To(HaveKeyWithValue("priorityClassName", "redlock-operator-critical"))
		Expect(podSpec(objs)).To(HaveKey("affinity"))

		By("two replicas with the budget and the PriorityClass switched off")
		objs = byKind(helmTemplate("redlock-system", "image.tag=dev",
			"podDisruptionBudget.enabled=false", "priorityClass.create=false", "priorityClassName=system-cluster-critical"))
		Expect(objs).NotTo(HaveKey("PodDisruptionBudget"))
		Expect(objs).NotTo(HaveKey("PriorityClass"))
		Expect(podSpec(objs)).To(HaveKeyWithValue("priorityClassName", "system-cluster-critical"), "a class of the user's")

		By("one replica: minAvailable 1 would block every drain, so no budget")
		objs = byKind(helmTemplate("redlock-system", "image.tag=dev", "replicas=1", "leaderElection.enabled=false"))
		Expect(objs).NotTo(HaveKey("PodDisruptionBudget"))

		By("the PriorityClass switched off while the pods still name it")
		out, err := helmTemplateErr("redlock-system", "image.tag=dev", "priorityClass.create=false")
		Expect(err).To(HaveOccurred(), "rendered pods that name a PriorityClass nobody creates:\n%s", out)
		Expect(out).To(ContainSubstring("priorityClass.create=false renders no PriorityClass"))
	})
})

// The upgrade from the previous release (hack/previous-release), for real
// (the suite's other specs only dry-run): its chart, which kept the CRDs in
// crds/, installed into a namespace made by --create-namespace; an upgrade
// to this tree's chart with --reuse-values, which adopts the CRDs
// (--take-ownership) and adds a field to one; an upgrade with other values;
// a rollback to the previous release; an uninstall.
var _ = Describe("The Helm chart installed with helm", func() {
	It("upgrades from the previous release with --reuse-values, adopting and upgrading its CRDs, rolls back, and leaves the CRDs on uninstall", func() {
		const ns = "helm-install"
		dir := GinkgoT().TempDir()
		kubeconfig := env.Kubeconfig(dir)
		helmErr := func(args ...string) ([]byte, error) {
			cmd := exec.Command("go", append([]string{"tool", "-modfile=hack/tools/helm/go.mod", "helm", "--kubeconfig", kubeconfig}, args...)...)
			cmd.Dir = root
			// Nothing read from or written to the user's Helm settings.
			cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
				"HELM_CACHE_HOME="+filepath.Join(dir, "cache"), "HELM_DATA_HOME="+filepath.Join(dir, "data"))
			return cmd.CombinedOutput()
		}
		helm := func(args ...string) {
			out, err := helmErr(args...)
			Expect(err).NotTo(HaveOccurred(), "helm %s: %s", strings.Join(args, " "), out)
		}
		// Whatever happens, the suite's other specs get this tree's CRDs
		// back, without Helm's ownership.
		DeferCleanup(restoreCRDs)

		By("the previous release's chart, from the commit hack/previous-release names")
		version, commit := previous()
		archive := exec.Command("sh", "-c", "git archive "+commit+" charts/redlock-operator | tar -x -C "+dir)
		archive.Dir = root
		out, err := archive.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "git archive %s (%s) of the chart (a clone with history is needed): %s", commit, version, out)
		previous := filepath.Join(dir, "charts", "redlock-operator")
		Expect(filepath.Join(previous, "crds")).To(BeADirectory(), "the previous chart keeps its CRDs in crds/")

		By("installing it: Helm skips the CRDs of crds/ that exist (envtest's)")
		helm("install", "redlock-operator", previous, "--namespace", ns, "--create-namespace", "--set", "image.tag=dev")
		deploy := &unstructured.Unstructured{}
		deploy.SetAPIVersion("apps/v1")
		deploy.SetKind("Deployment")
		key := client.ObjectKey{Namespace: ns, Name: "redlock-operator-controller-manager"}
		Expect(env.Client.Get(env.Ctx, key, deploy)).To(Succeed())
		Expect(deploy.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "Helm"))

		By("a DistributedLock CRD older than this tree's: without spec.heartbeatTimeout")
		crdKey := client.ObjectKey{Name: "distributedlocks.coordination.redlock.dev"}
		older := crdFromBases(crdKey.Name)
		versions, _, _ := unstructured.NestedSlice(older.Object, "spec", "versions")
		unstructured.RemoveNestedField(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", "heartbeatTimeout")
		Expect(unstructured.SetNestedSlice(older.Object, versions, "spec", "versions")).To(Succeed())
		Expect(env.Client.Apply(env.Ctx, client.ApplyConfigurationFromUnstructured(older), client.ForceOwnership, client.FieldOwner("manifest-test"))).To(Succeed())
		Expect(specProperties(getCRD(crdKey.Name))).NotTo(HaveKey("heartbeatTimeout"), "CRD %s as an older release left it", crdKey.Name)

		By("upgrading to this tree's chart with --reuse-values: refused over CRDs Helm does not own, then adopted with --take-ownership")
		out, err = helmErr("upgrade", "redlock-operator", chartDir, "--namespace", ns, "--reuse-values")
		Expect(err).To(HaveOccurred(), "helm upgrade over CRDs Helm does not own: %s", out)
		Expect(string(out)).To(ContainSubstring("CustomResourceDefinition"), "the refusal names the CRDs")
		helm("upgrade", "redlock-operator", chartDir, "--namespace", ns, "--reuse-values", "--take-ownership")
		crd := getCRD(crdKey.Name)
		Expect(crd.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "Helm"), "CRD %s adopted by the release", crdKey.Name)
		Expect(specProperties(crd)).To(HaveKey("heartbeatTimeout"), "CRD %s upgraded by helm upgrade", crdKey.Name)

		By("upgrading again with other values")
		helm("upgrade", "redlock-operator", chartDir, "--namespace", ns, "--set", "image.tag=dev",
			"--set", "webhook.enabled=false", "--set", "replicas=1", "--set", "leaderElection.enabled=false")
		Expect(env.Client.Get(env.Ctx, key, deploy)).To(Succeed())
		replicas, _, _ := unstructured.NestedFieldNoCopy(deploy.Object, "spec", "replicas")
		Expect(replicas).To(BeNumerically("==", 1))
		mwc := &unstructured.Unstructured{}
		mwc.SetAPIVersion("admissionregistration.k8s.io/v1")
		mwc.SetKind("MutatingWebhookConfiguration")
		mwcKey := client.ObjectKey{Name: "redlock-operator-mutating-webhook-configuration"}
		err = env.Client.Get(env.Ctx, mwcKey, mwc)
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the upgrade removed the webhook: %v", err)

		By("rolling back to the previous release: its manager and webhook come back, the CRDs stay as upgraded")
		helm("rollback", "redlock-operator", "1", "--namespace", ns, "--wait=false")
		Expect(env.Client.Get(env.Ctx, mwcKey, mwc)).To(Succeed(), "the rollback brought the webhook back")
		Expect(env.Client.Get(env.Ctx, key, deploy)).To(Succeed())
		replicas, _, _ = unstructured.NestedFieldNoCopy(deploy.Object, "spec", "replicas")
		Expect(replicas).To(BeNumerically("==", 2), "the previous release's replicas")
		Expect(specProperties(getCRD(crdKey.Name))).To(HaveKey("heartbeatTimeout"), "CRD %s is kept as upgraded by a rollback to a release that had its CRDs in crds/", crdKey.Name)

		By("uninstalling: the manager goes, the CRDs stay")
		helm("uninstall", "redlock-operator", "--namespace", ns, "--wait")
		err = env.Client.Get(env.Ctx, key, deploy)
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "uninstalled: %v", err)
		for _, name := range []string{"distributedlocks", "redismastersets", "lockheartbeats"} {
			Expect(getCRD(name+".coordination.redlock.dev").GetAnnotations()).
				To(HaveKeyWithValue("helm.sh/resource-policy", "keep"), "CRD %s.coordination.redlock.dev left by helm uninstall", name)
		}
	})
})

func getCRD(name string) *unstructured.Unstructured {
	crd := &unstructured.Unstructured{}
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	Expect(env.Client.Get(env.Ctx, client.ObjectKey{Name: name}, crd)).To(Succeed(), "get CRD %s", name)
	return crd
}

// specProperties are the properties of spec in a CRD's first version's
// schema.
func specProperties(crd *unstructured.Unstructured) map[string]any {
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	Expect(versions).NotTo(BeEmpty(), "versions of CRD %s", crd.GetName())
	props, _, err := unstructured.NestedMap(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties")
	Expect(err).NotTo(HaveOccurred(), "spec properties of CRD %s", crd.GetName())
	return props
}

// basesCRDs are this tree's CRDs (config/crd/bases).
func basesCRDs() []*unstructured.Unstructured {
	files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	Expect(err).NotTo(HaveOccurred())
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f) //nolint:gosec // a file of this repository
		Expect(err).NotTo(HaveOccurred())
		out = append(out, objects(data)...)
	}
	return out
}

// crdFromBases is this tree's CRD name.
func crdFromBases(name string) *unstructured.Unstructured {
	for _, u := range basesCRDs() {
		if u.GetName() == name {
			return u
		}
	}
	Fail("no CRD " + name + " in config/crd/bases")
	return nil
}

// restoreCRDs gives the suite's other specs this tree's CRDs
// (config/crd/bases) back as envtest installed them: without Helm's
// ownership, so that a later install is refused and adopts them again.
func restoreCRDs() {
	for _, u := range basesCRDs() {
		Expect(env.Client.Apply(env.Ctx, client.ApplyConfigurationFromUnstructured(u), client.ForceOwnership, client.FieldOwner("manifest-test"))).
			To(Succeed(), "apply CRD %s", u.GetName())
		cur := getCRD(u.GetName())
		labels, annotations := cur.GetLabels(), cur.GetAnnotations()
		for _, k := range []string{"app.kubernetes.io/managed-by", "helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version"} {
			delete(labels, k)
		}
		for _, k := range []string{"meta.helm.sh/release-name", "meta.helm.sh/release-namespace", "helm.sh/resource-policy"} {
			delete(annotations, k)
		}
		cur.SetLabels(labels)
		cur.SetAnnotations(annotations)
		Expect(env.Client.Update(env.Ctx, cur)).To(Succeed(), "remove Helm's ownership of CRD %s", u.GetName())
	}
}

// helmTemplate renders the chart into namespace with the CRDs and the given
// --set values, for the API server version of the test environment.
func helmTemplate(namespace string, set ...string) []byte {
	out, err := helmTemplateErr(namespace, set...)
	Expect(err).NotTo(HaveOccurred(), "helm template %s: %s", strings.Join(set, " "), out)
	return out
}

// helmTemplateErr is helmTemplate for a render that may fail: the output,
// or helm's error output with the error.
func helmTemplateErr(namespace string, set ...string) ([]byte, error) {
	args := []string{"template", "redlock-operator", chartDir, "--namespace", namespace, "--include-crds", "--kube-version", serverVersion()}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return helmCommand(args...)
}

// helmCommand runs the pinned helm with args: its output, or its error
// output with the error.
func helmCommand(args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"tool", "-modfile=hack/tools/helm/go.mod", "helm"}, args...)...)
	cmd.Dir = root
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return errOut.Bytes(), err
	}
	return out.Bytes(), nil
}

// serverVersion is the envtest API server's version: helm built by `go
// tool` carries none of its own (it would assume v1.20).
func serverVersion() string {
	v, err := discovery.NewDiscoveryClientForConfigOrDie(env.Cfg).ServerVersion()
	Expect(err).NotTo(HaveOccurred())
	return v.GitVersion
}

// expectSameObjects fails unless the chart's render and the kustomize
// output hold the same objects — by apiVersion, kind, namespace and name —
// with the same content once normalised (see normalise), and says which
// object and field differ as a unified diff of the two.
func expectSameObjects(chart, kustomized []byte, what string) {
	got, want := index(objects(chart), true), index(objects(kustomized), false)
	var missing, extra []string
	for k := range want {
		if _, ok := got[k]; !ok {
			missing = append(missing, k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	Expect(missing).To(BeEmpty(), "objects of %s the chart does not render (apiVersion kind namespace/name)", what)
	Expect(extra).To(BeEmpty(), "objects the chart renders that %s does not have (apiVersion kind namespace/name)", what)
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if reflect.DeepEqual(got[k].Object, want[k].Object) {
			continue
		}
		diff, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
			A: difflib.SplitLines(toYAML(want[k])), B: difflib.SplitLines(toYAML(got[k])),
			FromFile: "kustomize build " + what, ToFile: "helm template " + chartDir, Context: 3,
		})
		Expect(err).NotTo(HaveOccurred())
		diffs = append(diffs, k+":\n"+diff)
	}
	if len(diffs) > 0 {
		Fail(fmt.Sprintf("the chart differs from %s:\n%s", what, strings.Join(diffs, "\n")))
	}
}

// index keys normalised objects by "apiVersion kind namespace/name".
func index(objs []*unstructured.Unstructured, fromChart bool) map[string]*unstructured.Unstructured {
	m := map[string]*unstructured.Unstructured{}
	for _, u := range objs {
		normalise(u, fromChart)
		k := fmt.Sprintf("%s %s %s/%s", u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName())
		Expect(m).NotTo(HaveKey(k), "%s twice", k)
		m[k] = u
	}
	return m
}

// normalise removes what legitimately differs between the two renderings,
// and nothing else:
//   - the Helm labels (helmLabels) from the chart's metadata.labels;
//   - the annotation helm.sh/resource-policy: keep from the chart's CRDs
//     (and only from CRDs), which tells helm uninstall to leave them;
//   - the namespace of cluster-scoped objects, on both sides: kustomize's
//     namespace transformer does not know the scope of every kind and sets
//     one on the ValidatingAdmissionPolicy and its binding, which the API
//     server drops (the scope comes from envtest's RESTMapper; a kind it
//     does not serve, such as ServiceMonitor, keeps its namespace).
func normalise(u *unstructured.Unstructured, fromChart bool) {
	if fromChart {
		labels := u.GetLabels()
		for _, l := range helmLabels {
			delete(labels, l)
		}
		if len(labels) == 0 {
			unstructured.RemoveNestedField(u.Object, "metadata", "labels")
		} else {
			u.SetLabels(labels)
		}
		if u.GetKind() == "CustomResourceDefinition" {
			annotations := u.GetAnnotations()
			Expect(annotations).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"), "CRD %s kept by helm uninstall", u.GetName())
			delete(annotations, "helm.sh/resource-policy")
			u.SetAnnotations(annotations)
		}
	}
	if namespaced, err := env.Client.IsObjectNamespaced(u); err == nil && !namespaced {
		u.SetNamespace("")
	}
}

func toYAML(u *unstructured.Unstructured) string {
	data, err := yaml.Marshal(u.Object)
	Expect(err).NotTo(HaveOccurred())
	return string(data)
}

func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, u := range objs {
		out = append(out, u.GetKind())
	}
	return out
}

func names(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, u := range objs {
		out = append(out, u.GetNamespace()+"/"+u.GetName())
	}
	return out
}

// previous is the release hack/previous-release names.
func previous() (version, commit string) {
	version, commit, err := previousrelease.Previous(root)
	Expect(err).NotTo(HaveOccurred())
	return version, commit
}
