// Package prometheus_test checks the operator's alerting rules and Grafana
// dashboard with Debian's promtool (make prometheus installs it), and that
// the metrics reference names every metric and alert.
package prometheus_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/redlock-operator/redlock-operator/internal/metrics"
)

var root = func() string { _, f, _, _ := runtime.Caller(0); return filepath.Join(filepath.Dir(f), "..", "..") }()

func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Fatal("promtool is missing: run make prometheus (hack/install-prometheus.sh)")
	}
	cmd := exec.Command("promtool", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertingRules checks config/prometheus/rules.yaml and runs its unit
// tests (rules_test.yaml) with the real promtool.
func TestAlertingRules(t *testing.T) {
	dir := filepath.Join(root, "config", "prometheus")
	promtool(t, dir, "check", "rules", "rules.yaml")
	out := promtool(t, dir, "test", "rules", "rules_test.yaml")
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules did not succeed:\n%s", out)
	}
}

type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// grafanaVariables stand for the dashboard's variables in what promtool
// checks: Grafana's own interval and the selectors' "All".
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$namespace", ".*", "$job", ".*")

// TestDashboardQueries parses every query of the Grafana dashboard with
// promtool, as recording rules of a generated rule file, and checks that
// each names only metrics the operator exports.
func TestDashboardQueries(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "config", "grafana", "redlock-operator.json")) //nolint:gosec // a file of this repository
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	var exprs []string
	for i, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for j, target := range p.Targets {
			e := grafanaVariables.Replace(target.Expr)
			exprs = append(exprs, e)
			rules = append(rules, rule{Record: fmt.Sprintf("dashboard:panel%d_target%d", i+1, j+1), Expr: e})
		}
	}
	for _, v := range d.Templating.List {
		if strings.HasPrefix(v.Definition, "label_values(") {
			exprs = append(exprs, v.Definition)
		}
	}
	if len(rules) < 10 {
		t.Fatalf("found %d dashboard queries, want every panel's", len(rules))
	}
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yaml"), out, 0o600); err != nil {
		t.Fatal(err)
	}
	promtool(t, dir, "check", "rules", "dashboard.yaml")

	exported := exportedNames()
	for _, e := range exprs {
		for _, name := range regexp.MustCompile(`\bredlock_[a-z_]+`).FindAllString(e, -1) {
			if !slices.Contains(exported, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")) {
				t.Errorf("dashboard query %q names %s, which the operator does not export", e, name)
			}
		}
	}
}

// exportedNames are the names of every metric the operator itself
// exports (not a histogram's _bucket, _sum and _count series).
func exportedNames() []string {
	collectors := append(metrics.New().Collectors(), &metrics.StateCollector{})
	descs := make(chan *prometheus.Desc, 100)
	go func() {
		for _, c := range collectors {
			c.Describe(descs)
		}
		close(descs)
	}()
	var names []string
	for d := range descs {
		names = append(names, regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String())[1])
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// TestMetricsReference checks that docs/reference/metrics.md names every
// metric the operator exports and every alert it ships.
func TestMetricsReference(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "reference", "metrics.md")) //nolint:gosec // a file of this repository
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range exportedNames() {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/reference/metrics.md does not name metric %s", name)
		}
	}
	rules, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "rules.yaml")) //nolint:gosec // a file of this repository
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(string(rules), -1) {
		if !strings.Contains(string(doc), "`"+m[1]+"`") {
			t.Errorf("docs/reference/metrics.md does not name alert %s", m[1])
		}
	}
}

// runbookBase is where every alert's runbook_url points: its section of
// docs/reference/metrics.md on the default branch.
const runbookBase = "https://github.com/redlock-operator/redlock-operator/blob/main/docs/reference/metrics.md#"

// TestRunbooks checks that every alert links, with runbook_url, to a
// section of docs/reference/metrics.md headed with its name.
func TestRunbooks(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "reference", "metrics.md")) //nolint:gosec // a file of this repository
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "rules.yaml")) //nolint:gosec // a file of this repository
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if want := runbookBase + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("alert %s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !regexp.MustCompile("(?m)^### `" + r.Alert + "`$").Match(doc) {
				t.Errorf("docs/reference/metrics.md has no section ### `%s` for the alert's runbook_url", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts read from rules.yaml")
	}
}
