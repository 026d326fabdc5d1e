// Command helmchart writes the parts of the Helm chart that are copies of
// the kustomize output, so that the chart cannot drift from it: the CRDs
// (templates/generated/crds.yaml: templates, so that helm upgrade upgrades
// them, annotated helm.sh/resource-policy: keep, so that helm uninstall
// leaves them and every lock in place) and every object that no chart value changes beyond being
// switched on or off and following the release namespace — RBAC (role.yaml
// comes from the +kubebuilder:rbac markers), the ServiceAccount, the
// Namespace, the webhook's Secret, Service and MutatingWebhookConfiguration,
// the metrics certificate's Secret,
// the ValidatingAdmissionPolicy and its binding, the manager's
// PodDisruptionBudget and PriorityClass — into templates/generated/. The
// manager's ClusterRole and binding are also rendered as a Role and
// RoleBinding in each namespace of .Values.watchNamespaces, as
// config/watch-namespaces does (test/manifests compares the two). The
// admission policy's operator identity (the only one that may mark
// holders) names the ServiceAccount in the release namespace. Two fields
// follow values too: the webhooks' timeoutSeconds (webhook.timeoutSeconds)
// and the ServiceAccount's annotations (serviceAccount.annotations).
// The Deployment and the metrics Service, which the chart's values shape,
// are written by hand (templates/deployment.yaml, templates/metrics.yaml);
// test/manifests renders the chart and compares it with the kustomize
// output object by object.
//
//	kustomize build config/default | go run ./hack/helmchart charts/redlock-operator
//
// (`make helm-chart` does this.) An object the tables below do not know
// fails the run: decide where it goes in the chart.
package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// namespace is the namespace config/default installs into; in the chart,
// every occurrence (metadata, RBAC subjects, the webhook's service
// reference, the Namespace object itself) becomes the release namespace.
const namespace = "redlock-system"

// placement says where an object of the kustomize output goes.
type placement struct {
	kind, name string // name "" matches every object of the kind
	// file is the template under templates/generated/; "" with handWritten
	// set means a hand-written template renders the object.
	file        string
	condition   string // a template expression; "" renders the object always
	handWritten string
	// watched renders the object (a ClusterRole or ClusterRoleBinding) also
	// as a Role or RoleBinding named watchedName in each namespace of
	// .Values.watchNamespaces, as config/watch-namespaces does.
	watched     bool
	watchedName string
}

// notWatching renders an object only when the operator watches the whole
// cluster.
const notWatching = "not .Values.watchNamespaces"

// secureMetrics renders an object only for the HTTPS metrics endpoint.
const secureMetrics = "and .Values.metrics.enabled .Values.metrics.secure"

var placements = []placement{
	// dig: a release upgraded with --reuse-values from a chart without
	// the value renders as the default.
	{kind: "CustomResourceDefinition", file: "crds.yaml", condition: `dig "crds" "install" true .Values.AsMap`},
	{kind: "Namespace", file: "namespace.yaml", condition: ".Values.namespace.create"},
	{kind: "ServiceAccount", file: "rbac.yaml"},
	{kind: "Role", file: "rbac.yaml"},
	// With watchNamespaces the manager's rules are a Role in each watched
	// namespace, and it reads no Node.
	{kind: "ClusterRole", name: "redlock-operator-manager-role", file: "rbac.yaml", condition: notWatching,
		watched: true, watchedName: "redlock-operator-watch-role"},
	{kind: "ClusterRoleBinding", name: "redlock-operator-manager-rolebinding", file: "rbac.yaml", condition: notWatching,
		watched: true, watchedName: "redlock-operator-watch-rolebinding"},
	{kind: "ClusterRole", name: "redlock-operator-node-reader-role", file: "rbac.yaml", condition: notWatching},
	{kind: "ClusterRoleBinding", name: "redlock-operator-node-reader-rolebinding", file: "rbac.yaml", condition: notWatching},
	// The cluster-scoped rules of the secure metrics endpoint and of the
	// webhook's CA bundle, only where those are on.
	{kind: "ClusterRole", name: "redlock-operator-metrics-auth-role", file: "rbac.yaml", condition: secureMetrics},
	{kind: "ClusterRoleBinding", name: "redlock-operator-metrics-auth-rolebinding", file: "rbac.yaml", condition: secureMetrics},
	{kind: "ClusterRole", name: "redlock-operator-webhook-ca-role", file: "rbac.yaml", condition: ".Values.webhook.enabled"},
	{kind: "ClusterRoleBinding", name: "redlock-operator-webhook-ca-rolebinding", file: "rbac.yaml", condition: ".Values.webhook.enabled"},
	{kind: "ClusterRole", file: "rbac.yaml"},
	{kind: "RoleBinding", file: "rbac.yaml"},
	{kind: "ClusterRoleBinding", file: "rbac.yaml"},
	{kind: "Secret", name: "redlock-operator-webhook-server-cert", file: "webhook.yaml", condition: ".Values.webhook.enabled"},
	{kind: "Secret", name: "redlock-operator-metrics-server-cert", file: "metrics-certificate.yaml", condition: secureMetrics},
	{kind: "Service", name: "redlock-operator-webhook-service", file: "webhook.yaml", condition: ".Values.webhook.enabled"},
	{kind: "MutatingWebhookConfiguration", file: "webhook.yaml", condition: ".Values.webhook.enabled"},
	{kind: "ValidatingAdmissionPolicy", file: "admission-policy.yaml", condition: ".Values.admissionPolicy.enabled"},
	{kind: "ValidatingAdmissionPolicyBinding", file: "admission-policy.yaml", condition: ".Values.admissionPolicy.enabled"},
	// With one replica, minAvailable 1 would refuse every eviction of the
	// manager and block node drains: no budget then.
	{kind: "PodDisruptionBudget", name: "redlock-operator-controller-manager", file: "availability.yaml",
		condition: "and .Values.podDisruptionBudget.enabled (gt (int .Values.replicas) 1)"},
	{kind: "PriorityClass", name: "redlock-operator-critical", file: "availability.yaml", condition: ".Values.priorityClass.create"},
	{kind: "Deployment", name: "redlock-operator-controller-manager", handWritten: "templates/deployment.yaml"},
	{kind: "Service", name: "redlock-operator-controller-manager-metrics-service", handWritten: "templates/metrics.yaml"},
}

// clusterScoped and namespaced are the kinds whose scope is known. kustomize
// does not know every kind's scope (it sets a namespace on the
// ValidatingAdmissionPolicy, which the API server ignores); the chart sets
// one only where it belongs.
var (
	clusterScoped = set("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
		"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
		"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "PriorityClass")
	namespaced = set("ServiceAccount", "Role", "RoleBinding", "Secret", "ConfigMap", "Service", "Deployment",
		"PodDisruptionBudget")
)

// prefixedHoldsPolicy is the admission policy that names the operator's
// identity (variable operator), as config/default names it.
const prefixedHoldsPolicy = "redlock-operator-lock-gate-needs-label"

// keepAnnotation on an object makes helm uninstall leave it.
const keepAnnotation = "helm.sh/resource-policy"

const (
	header = "{{- /* Code generated by hack/helmchart from `kustomize build config/default` (make helm-chart). DO NOT EDIT. */}}\n"
	// Placeholders marshalled into the YAML, then turned into template
	// actions.
	nsPlaceholder          = "__RELEASE_NAMESPACE__"
	ownNSPlaceholder       = "__OWN_NAMESPACE__"
	labelsPlaceholder      = "__HELM_LABELS__"
	selectorPlaceholder    = "__WATCHED_NAMESPACE_SELECTOR__"
	timeoutPlaceholder     = "__WEBHOOK_TIMEOUT__"
	annotationsPlaceholder = "__SERVICE_ACCOUNT_ANNOTATIONS__"
)

// webhookTimeout is the webhooks' timeoutSeconds in config/default (the
// +kubebuilder:webhook markers), the default of .Values.webhook.timeoutSeconds.
const webhookTimeout = 10

var (
	labelsLine      = regexp.MustCompile(`(?m)^( *)` + labelsPlaceholder + `: ""$`)
	selectorLine    = regexp.MustCompile(`(?m)^( *)namespaceSelector: ` + selectorPlaceholder + `$`)
	annotationsLine = regexp.MustCompile(`(?m)^( *)` + annotationsPlaceholder + `: ""$`)
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kustomize build config/default | helmchart CHART_DIR")
		os.Exit(2)
	}
	if err := run(os.Stdin, os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "helmchart:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, chart string) error {
	objs, err := decode(in)
	if err != nil {
		return err
	}
	if err := templateOperator(objs); err != nil {
		return err
	}
	files := map[string][]byte{}
	crds := 0
	for _, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" {
			crds++
			annotations := u.GetAnnotations()
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations[keepAnnotation] = "keep"
			u.SetAnnotations(annotations)
		}
		p, ok := place(u)
		if !ok {
			return fmt.Errorf("%s %s: not placed in the chart: add it to the placements of hack/helmchart", u.GetKind(), u.GetName())
		}
		if p.handWritten != "" {
			continue
		}
		doc, err := template(u, p.condition)
		if err != nil {
			return err
		}
		if p.watched {
			w, err := watched(u, p.watchedName)
			if err != nil {
				return err
			}
			doc += w
		}
		if files[p.file] == nil {
			files[p.file] = []byte(header)
		}
		files[p.file] = append(files[p.file], doc...)
	}
	if crds == 0 {
		return errors.New("no CustomResourceDefinition in the input: pipe `kustomize build config/default` in")
	}
	// The directory is owned by this program: files it no longer writes
	// go.
	root, err := os.OpenRoot(chart)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }()
	return rewrite(root, filepath.Join("templates", "generated"), files)
}

func decode(in io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(in, 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

func place(u *unstructured.Unstructured) (placement, bool) {
	for _, p := range placements {
		if p.kind == u.GetKind() && (p.name == "" || p.name == u.GetName()) {
			return p, true
		}
	}
	return placement{}, false
}

// template turns one object into a chart template: the release namespace
// wherever config/default has its own, Helm's labels next to kustomize's,
// the whole document under condition.
func template(u *unstructured.Unstructured, condition string) (string, error) {
	text, err := body(u, ".", "{{ .Release.Namespace }}")
	if err != nil {
		return "", err
	}
	doc := "---\n" + text
	if condition != "" {
		doc = "{{- if " + condition + " }}\n" + doc + "{{- end }}\n"
	}
	return doc, nil
}

// operatorIdentity is the admission policy's variable operator, the
// manager's ServiceAccount as the API server names it, with the namespace
// and the account's name as separate CEL string literals (config/default
// writes them with kustomize replacements).
const operatorIdentity = "'system:serviceaccount:' + '%s' + ':' + '%s'"

// templateOperator makes the admission policy's operator identity follow
// the release namespace: only that identity may mark holders. Its
// ServiceAccount's name is the one the chart renders.
func templateOperator(objs []*unstructured.Unstructured) error {
	var accounts []string
	for _, u := range objs {
		if u.GetKind() == "ServiceAccount" {
			accounts = append(accounts, u.GetName())
		}
	}
	if len(accounts) != 1 {
		return fmt.Errorf("the admission policy names the manager's ServiceAccount: want one ServiceAccount in the input, found %v", accounts)
	}
	for _, u := range objs {
		if u.GetKind() != "ValidatingAdmissionPolicy" {
			continue
		}
		vars, _, err := unstructured.NestedSlice(u.Object, "spec", "variables")
		if err != nil {
			return err
		}
		found := false
		for _, v := range vars {
			if v, ok := v.(map[string]any); ok && v["name"] == "operator" {
				want := fmt.Sprintf(operatorIdentity, namespace, accounts[0])
				if v["expression"] != want {
					return fmt.Errorf("ValidatingAdmissionPolicy %s: variable operator is %q, want %q (see config/default's replacements)", u.GetName(), v["expression"], want)
				}
				v["expression"] = fmt.Sprintf(operatorIdentity, nsPlaceholder, accounts[0])
				found = true
			}
		}
		if !found && u.GetName() == prefixedHoldsPolicy {
			return fmt.Errorf("ValidatingAdmissionPolicy %s: no variable operator (the identity allowed to mark holders)", u.GetName())
		}
		if !found {
			continue // a policy that names no operator
		}
		if err := unstructured.SetNestedSlice(u.Object, vars, "spec", "variables"); err != nil {
			return err
		}
	}
	return nil
}

// watched turns a ClusterRole or ClusterRoleBinding into a Role or
// RoleBinding named name in each namespace of .Values.watchNamespaces.
func watched(u *unstructured.Unstructured, name string) (string, error) {
	u = u.DeepCopy()
	switch u.GetKind() {
	case "ClusterRole":
		u.SetKind("Role")
	case "ClusterRoleBinding":
		u.SetKind("RoleBinding")
		ref, _, _ := unstructured.NestedString(u.Object, "roleRef", "name")
		if ref != "redlock-operator-manager-role" {
			return "", fmt.Errorf("ClusterRoleBinding %s binds %s, not the manager's ClusterRole", u.GetName(), ref)
		}
		if err := unstructured.SetNestedField(u.Object, "Role", "roleRef", "kind"); err != nil {
			return "", err
		}
		if err := unstructured.SetNestedField(u.Object, "redlock-operator-watch-role", "roleRef", "name"); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("%s %s: only a ClusterRole or ClusterRoleBinding is copied into the watched namespaces", u.GetKind(), u.GetName())
	}
	u.SetName(name)
	text, err := body(u, "$", "{{ . }}")
	if err != nil {
		return "", err
	}
	return "{{- range .Values.watchNamespaces }}\n---\n" + text + "{{- end }}\n", nil
}

// body is the YAML of one object as a template, with root the template's
// top-level value ("." or, inside a range, "$") and ownNamespace the
// template text of a namespaced object's own namespace.
func body(u *unstructured.Unstructured, root, ownNamespace string) (string, error) {
	u = u.DeepCopy()
	scoped, err := isNamespaced(u.GetKind())
	if err != nil {
		return "", err
	}
	u.SetNamespace("")
	u.Object = replaceStrings(u.Object, namespace, nsPlaceholder).(map[string]any)
	if scoped {
		u.SetNamespace(ownNSPlaceholder)
	}
	switch u.GetKind() {
	case "MutatingWebhookConfiguration":
		if err := markWebhooks(u); err != nil {
			return "", err
		}
	case "ServiceAccount":
		// Annotations from .Values.serviceAccount.annotations, e.g. a
		// cloud identity (IRSA, Workload Identity).
		if len(u.GetAnnotations()) > 0 {
			return "", fmt.Errorf("ServiceAccount %s: config/default annotates it, which the chart's serviceAccount.annotations would replace", u.GetName())
		}
		if err := unstructured.SetNestedField(u.Object, "", "metadata", annotationsPlaceholder); err != nil {
			return "", err
		}
	}
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[labelsPlaceholder] = ""
	u.SetLabels(labels)
	data, err := yaml.Marshal(u.Object)
	if err != nil {
		return "", err
	}
	// Text of the object that looks like a template action stays text.
	text := strings.ReplaceAll(string(data), "{{", `{{ "{{" }}`)
	if strings.Count(text, labelsPlaceholder) != 1 {
		return "", fmt.Errorf("%s %s: labels placeholder not found once", u.GetKind(), u.GetName())
	}
	text = labelsLine.ReplaceAllStringFunc(text, func(line string) string {
		in := indentOf(line)
		return fmt.Sprintf(`%s{{- include "redlock-operator.helmLabels" %s | nindent %d }}`, in, root, len(in))
	})
	path := strings.TrimSuffix(root, ".") // what .Values and .Release hang from
	// With watchNamespaces, pods of other namespaces are not even sent to
	// the webhook, as config/watch-namespaces sets it.
	text = selectorLine.ReplaceAllStringFunc(text, func(line string) string {
		in := indentOf(line)
		return in + "{{- with " + path + ".Values.watchNamespaces }}\n" +
			in + "namespaceSelector:\n" +
			in + "  matchExpressions:\n" +
			in + "  - key: kubernetes.io/metadata.name\n" +
			in + "    operator: In\n" +
			in + "    values: {{ toJson . }}\n" +
			in + "{{- end }}"
	})
	// dig: a release upgraded with --reuse-values from a chart without
	// the value renders the default.
	text = strings.ReplaceAll(text, "timeoutSeconds: "+timeoutPlaceholder,
		fmt.Sprintf(`timeoutSeconds: {{ dig "webhook" "timeoutSeconds" %d %s.Values.AsMap }}`, webhookTimeout, path))
	text = annotationsLine.ReplaceAllStringFunc(text, func(line string) string {
		in := indentOf(line)
		return in + `{{- with dig "serviceAccount" "annotations" dict ` + path + ".Values.AsMap }}\n" +
			in + "annotations:\n" +
			in + fmt.Sprintf("  {{- toYaml . | nindent %d }}\n", len(in)+2) +
			in + "{{- end }}"
	})
	for _, p := range []string{labelsPlaceholder, selectorPlaceholder, timeoutPlaceholder, annotationsPlaceholder} {
		if strings.Contains(text, p) {
			return "", fmt.Errorf("%s %s: placeholder %s left in the template", u.GetKind(), u.GetName(), p)
		}
	}
	text = strings.ReplaceAll(text, ownNSPlaceholder, ownNamespace)
	return strings.ReplaceAll(text, nsPlaceholder, "{{ "+path+".Release.Namespace }}"), nil
}

// indentOf is the spaces line starts with: a placeholder's line is
// replaced by template text at its indentation.
func indentOf(line string) string {
	return line[:len(line)-len(strings.TrimLeft(line, " "))]
}

// markWebhooks puts a placeholder where each webhook's namespaceSelector
// goes (config/default has none) and where its timeoutSeconds is.
func markWebhooks(u *unstructured.Unstructured) error {
	hooks, _, err := unstructured.NestedSlice(u.Object, "webhooks")
	if err != nil {
		return err
	}
	for _, h := range hooks {
		hook, ok := h.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: a webhook is not an object", u.GetName())
		}
		if _, set := hook["namespaceSelector"]; set {
			return fmt.Errorf("%s: config/default sets a namespaceSelector, which the chart's watchNamespaces would replace", u.GetName())
		}
		hook["namespaceSelector"] = selectorPlaceholder
		if fmt.Sprint(hook["timeoutSeconds"]) != fmt.Sprint(webhookTimeout) {
			return fmt.Errorf("%s: webhook %v has timeoutSeconds %v, want %d, the chart's default", u.GetName(), hook["name"], hook["timeoutSeconds"], webhookTimeout)
		}
		hook["timeoutSeconds"] = timeoutPlaceholder
	}
	return unstructured.SetNestedSlice(u.Object, hooks, "webhooks")
}

func isNamespaced(kind string) (bool, error) {
	switch {
	case namespaced[kind]:
		return true, nil
	case clusterScoped[kind]:
		return false, nil
	}
	return false, fmt.Errorf("kind %s: scope unknown: add it to hack/helmchart's tables", kind)
}

// replaceStrings replaces every string value equal to from (not substrings:
// CEL and messages are left alone).
func replaceStrings(v any, from, to string) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = replaceStrings(e, from, to)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = replaceStrings(e, from, to)
		}
		return v
	case string:
		if v == from {
			return to
		}
	}
	return v
}

// rewrite makes dir (in the chart) hold exactly files (name → content).
func rewrite(root *os.Root, dir string, files map[string][]byte) error {
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := fs.Glob(root.FS(), filepath.ToSlash(filepath.Join(dir, "*.yaml")))
	if err != nil {
		return err
	}
	for _, f := range old {
		if _, keep := files[path.Base(f)]; !keep {
			if err := root.Remove(f); err != nil {
				return err
			}
		}
	}
	for name, data := range files {
		if err := root.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func set(kinds ...string) map[string]bool {
	m := map[string]bool{}
	for _, k := range kinds {
		m[k] = true
	}
	return m
}
