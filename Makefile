# redlock-operator Makefile (kubebuilder's layout: `make help` lists targets).

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

GO ?= go
# Tools are pinned in hack/tools/go.mod and run with `go tool`.
GOTOOL := $(GO) tool -modfile=hack/tools/go.mod
GOLANGCI_LINT := $(GOTOOL) golangci-lint
CONTROLLER_GEN := $(GOTOOL) controller-gen
KUSTOMIZE := $(GOTOOL) kustomize
CRD_REF_DOCS := $(GOTOOL) crd-ref-docs
# Helm has a module of its own (hack/tools/helm/go.mod): in hack/tools/go.mod
# its Kubernetes dependencies would raise the pinned kustomize.
HELM := $(GO) tool -modfile=hack/tools/helm/go.mod helm
CHART := charts/redlock-operator
KUBECTL ?= kubectl
IMG ?= redlock-operator:dev
CONTAINER_TOOL ?= docker
# The version the binaries report (--version, logs, the build_info metric):
# the tag of a tagged release, else hack/next-version marked as a
# development build of the commit (v0.2.0-dev+<sha>; hack/version.sh); the
# Dockerfile stamps the same way (VERSION arg).
VERSION ?= $(shell hack/version.sh)
# How every binary is built, here and in the Dockerfile: static, trimmed,
# stamped. BIN is where `make build` writes them.
GO_BUILD := CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version=$(VERSION)"
BIN ?= bin
# Platforms of `make docker-buildx`.
PLATFORMS ?= linux/amd64,linux/arm64,linux/s390x,linux/ppc64le

# The envtest control plane (kube-apiserver, etcd) is built from the Go module
# proxy by hack/build-envtest.sh into a cache outside the checkout.
ENVTEST_K8S_VERSION ?= v1.37.2
ENVTEST_ETCD_VERSION ?= v3.6.16
ENVTEST := KUBE_VERSION=$(ENVTEST_K8S_VERSION) ETCD_VERSION=$(ENVTEST_ETCD_VERSION) hack/build-envtest.sh
# helm built by `go tool` is not stamped with a Kubernetes version (it would
# assume v1.20, older than the chart's kubeVersion): lint and render for the
# version the tests run against.
HELM_KUBE_VERSION ?= $(ENVTEST_K8S_VERSION)

# Test flags: race detector on, no cached results.
# test/manifests builds the release inside its test: from a cold build
# cache, beside every other package, that once took more than go test's
# default 10m.
TEST_FLAGS ?= -race -count=1 -timeout 20m
# Benchmark program flags (see hack/bench).
BENCH_FLAGS ?=
BENCH_HANDOVER_FLAGS ?=

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Generate CRDs and RBAC from the markers in api/ and controllers/.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: ## Generate deep-copy code from the markers in api/.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./..."

.PHONY: api-docs
api-docs: ## Generate docs/reference/api.md (API reference) from the Go types in api/.
	@mkdir -p docs/reference
	@# Log level ERROR: the only warnings are about the depth of Kubernetes'
	@# own types (Affinity), which the reference links to rather than renders.
	$(CRD_REF_DOCS) --source-path=api/v1alpha1 --config=hack/crd-ref-docs.yaml \
		--templates-dir=hack/crd-ref-docs-templates --renderer=markdown \
		--output-path=docs/reference/api.md --log-level=ERROR

.PHONY: helm-docs
helm-docs: ## Generate docs/reference/helm-values.md (Helm values reference) from the chart's values.yaml and values.schema.json.
	$(GO) run ./hack/helmdocs $(CHART) docs/reference/helm-values.md

.PHONY: monitoring
monitoring: ## Write config/prometheus/prometheusrule.yaml from rules.yaml, and the chart's copies of the rules and the Grafana dashboard.
	@hack/monitoring.sh $(CHART)

.PHONY: helm-chart
helm-chart: manifests monitoring ## Sync the Helm chart's generated parts (templates/generated/, the CRDs included) from kustomize build config/default.
	$(KUSTOMIZE) build config/default | $(GO) run ./hack/helmchart $(CHART)

.PHONY: helm-lint
helm-lint: ## Lint the Helm chart (helm lint --strict) and render it, with the default values and with the optional parts switched.
	$(HELM) lint --strict --kube-version $(HELM_KUBE_VERSION) $(CHART)
	$(HELM) lint --strict --kube-version $(HELM_KUBE_VERSION) $(CHART) --namespace locks-operator \
		--set namespace.create=true,webhook.enabled=false,admissionPolicy.enabled=false,metrics.secure=false,metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.grafanaDashboard.enabled=true,replicas=1,leaderElection.enabled=false \
		--set podDisruptionBudget.enabled=false,priorityClass.create=false,priorityClassName=,affinity=null \
		--set 'watchNamespaces={team-a,team-b}'
	$(HELM) template redlock-operator $(CHART) --namespace redlock-system --kube-version $(HELM_KUBE_VERSION) --include-crds >/dev/null
	$(HELM) template redlock-operator $(CHART) --namespace locks-operator --kube-version $(HELM_KUBE_VERSION) \
		--set metrics.enabled=false,webhook.enabled=false,replicas=1,leaderElection.enabled=false >/dev/null

.PHONY: fmt
fmt: ## Run go fmt against code.
	$(GO) fmt ./...

.PHONY: vet
vet: ## Run go vet against code (the benchmark module included).
	$(GO) vet ./...
	cd hack/bench && $(GO) vet ./...

.PHONY: lint
lint: ## Run golangci-lint (pinned in hack/tools/go.mod), the e2e suite included.
	$(GOLANGCI_LINT) run ./...
	$(GOLANGCI_LINT) run --build-tags e2e ./test/e2e/
	$(GOLANGCI_LINT) run --build-tags gateclocktest ./cmd/gate/

.PHONY: lint-fix
lint-fix: ## Run golangci-lint and apply its fixes.
	$(GOLANGCI_LINT) run --fix ./...

.PHONY: build-installer
build-installer: manifests ## Write dist/install.yaml: CRDs, RBAC, manager (image IMG), webhook and admission policy in one file.
	@mkdir -p dist
	@# The image appears twice (the container and OPERATOR_IMAGE, which must
	@# match): both are written as the default image by config/manager.
	$(KUSTOMIZE) build config/default | sed 's|redlock-operator:dev|$(IMG)|g' > dist/install.yaml

.PHONY: verify
verify: prometheus manifests generate api-docs helm-docs ## Fail when generated files (the Helm chart's included), go.mod/go.sum or formatting are stale; lint the chart; check the alerting rules with promtool and every link of the docs; check the flags, labels and metrics references against the code; no tracked file over 1 MiB.
	@$(MAKE) --no-print-directory build-installer IMG=redlock-operator:dev
	@$(MAKE) --no-print-directory helm-chart
	@git diff --exit-code -- api config dist docs/reference/api.md docs/reference/helm-values.md charts || { echo "generated files are stale: run 'make manifests generate build-installer api-docs helm-docs helm-chart' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api config dist docs/reference/api.md docs/reference/helm-values.md charts | grep '^??')" || { git status --porcelain -- api config dist docs/reference/api.md docs/reference/helm-values.md charts; echo "untracked generated files: commit them"; exit 1; }
	$(KUSTOMIZE) build config/default >/dev/null
	$(KUSTOMIZE) build config/samples >/dev/null
	$(KUSTOMIZE) build config/watch-namespaces >/dev/null
	$(GO) mod tidy -diff
	cd hack/tools && $(GO) mod tidy -diff
	cd hack/tools/helm && $(GO) mod tidy -diff
	cd hack/bench && $(GO) mod tidy -diff
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	@$(MAKE) --no-print-directory helm-lint
	promtool check rules config/prometheus/rules.yaml
	cd config/prometheus && promtool test rules rules_test.yaml
	$(GO) test -count=1 -run '^(TestLabelsReference|TestFlagsReference|TestMetricsReference|TestRunbooks)$$' ./test/manifests/ ./cmd/manager/ ./test/prometheus/
	$(GO) test -count=1 -run '^TestDocLinks$$' ./test/manifests/
	@hack/check-file-sizes.sh

.PHONY: test
# CI keeps only the tail of a run's output: when a run fails, its failures
# are printed again last, with what failed.
TEST_LOG ?= $(CURDIR)/bin/test.log
E2E_REPORT ?= $(CURDIR)/bin/e2e-report.json

test: redis prometheus envtest ## Run all tests against real redis-server processes and a real kube-apiserver + etcd.
	@mkdir -p $(dir $(TEST_LOG))
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) test $(TEST_FLAGS) ./... 2>&1 | tee $(TEST_LOG) || \
		{ echo "== failures again, from $(TEST_LOG):"; grep -E -A6 -e '--- FAIL|\[FAILED\]|^panic:' $(TEST_LOG) | cut -c1-400 | tail -80; exit 1; }

.PHONY: envtest
envtest: ## Build kube-apiserver and etcd for envtest (cached; a no-op once built).
	@$(ENVTEST) >/dev/null

# The oldest Kubernetes minor the README claims, with an etcd of its line,
# and the envtest suites that run against it: the API (CRDs, CEL rules, the
# admission policy, the webhook, the chart), the controllers and the clients.
K8S_OLDEST ?= v1.30.14
K8S_OLDEST_ETCD ?= v3.5.21
K8S_OLDEST_PACKAGES ?= ./controllers/... ./test/manifests/ ./cmd/manager/ ./cmd/agent/ ./cmd/kubectl-redlock/... ./pkg/lockclient/ ./pkg/holding/

.PHONY: test-k8s-oldest
test-k8s-oldest: redis prometheus ## The envtest suites against the oldest Kubernetes the README claims (K8S_OLDEST, v1.30; kube-apiserver and etcd built from modules, cached). Not in CI: run it when the API or the claim changes.
	@assets="$$(KUBE_VERSION=$(K8S_OLDEST) ETCD_VERSION=$(K8S_OLDEST_ETCD) hack/build-envtest.sh)" && \
		echo "test-k8s-oldest: $$("$$assets/kube-apiserver" --version), etcd $$("$$assets/etcd" --version | sed -n 's/^etcd Version: //p')" && \
		KUBEBUILDER_ASSETS="$$assets" $(GO) test $(TEST_FLAGS) $(K8S_OLDEST_PACKAGES)

.PHONY: bench
bench: redis ## Benchmark pkg/redlock against go-redsync and the single-master floor; prints a table.
	$(GO) test -run '^$$' -bench . -benchtime 2000x ./pkg/redlock/
	cd hack/bench && $(GO) run . $(BENCH_FLAGS)

SEED ?= 0
DURATION ?= 10m
.PHONY: soak-controller
soak-controller: redis envtest ## Randomized history of two managers on two API servers under chaos (SEED=…, DURATION=10m); prints a table.
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) test -count=1 -timeout 0 -v ./test/history/ -args -seed=$(SEED) -duration=$(DURATION) \
		| grep -vE '^\s+[0-9]{4}-[0-9]{2}-[0-9]{2}T'

.PHONY: bench-handover
bench-handover: redis envtest ## Pod-to-pod handover latency (100 handovers) next to a client-go leaderelection Lease; prints a table.
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchhandover $(BENCH_HANDOVER_FLAGS)

.PHONY: bench-cross-cluster
bench-cross-cluster: redis envtest ## One key's handovers between two clusters (two envtest API servers, a manager process each) sharing 5 masters: within and across p50/p99, inversions against ticket order, before and with release notices and waiting lines, with one master paused too; prints a table (about 10 minutes).
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchcrosscluster $(BENCH_CROSS_CLUSTER_FLAGS)

.PHONY: bench-semaphore
bench-semaphore: redis envtest ## A DistributedSemaphore of 3 slots serving 30 pods next to a DistributedLock serving 30 (envtest; the program plays the kubelet): grants/s and handover p50/p99; prints a table.
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchsemaphore $(BENCH_SEMAPHORE_FLAGS)

.PHONY: bench-podgate
bench-podgate: redis envtest ## Pod-gate reconciles per status refresh with 1,000 pods queued on 10 held locks; prints a table.
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchpodgate $(BENCH_PODGATE_FLAGS)

.PHONY: bench-locks
bench-locks: redis envtest ## One manager holding 1000 locks (ttl 10s) on envtest + 5 masters for 2 minutes; prints a table.
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchlocks $(BENCH_LOCKS_FLAGS)

.PHONY: bench-overload
bench-overload: redis envtest ## The overload sweep: bench-locks behind an API server of 40, 75, 110, 150 writes/s and stepped 150→50, 1,000 locks at ttl 10s and 2,000 at 30s, BENCH_OVERLOAD_RUNS runs each (default 1; BENCH_OVERLOAD_FLAGS=-hog); prints a summary table (about an hour a run).
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" hack/bench-overload.sh $(or $(BENCH_OVERLOAD_RUNS),1)

.PHONY: bench-locks-10k
bench-locks-10k: redis envtest ## One manager holding 10,000 locks (ttl 60s, --kube-api-qps 400) for 5 minutes; prints a table (about 10 minutes).
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchlocks -locks 10000 -ttl 60s -duration 5m -sample 10s -kube-api-qps 400 -grant-timeout 10m $(BENCH_LOCKS_FLAGS)

.PHONY: bench-failover
bench-failover: redis envtest ## Leader handovers (SIGTERM, then SIGKILL) with 1,000 locks at ttl 30s, then at ttl 10s, held by two manager processes; prints tables (about 10 minutes).
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchfailover -locks 1000 -ttl 30s $(BENCH_FAILOVER_FLAGS)
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchfailover -locks 1000 -ttl 10s $(BENCH_FAILOVER_FLAGS)

.PHONY: bench-failover-10k
bench-failover-10k: redis envtest ## Leader handovers with 10,000 locks at ttl 60s (--kube-api-qps 400): needs more than 2 cores to finish (docs/design/failover.md); prints a table.
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchfailover -locks 10000 -ttl 60s -kube-api-qps 400 -grant-timeout 10m $(BENCH_FAILOVER_FLAGS)

BENCH_FAILOVER_PODS ?= 30
.PHONY: bench-failover-pods
bench-failover-pods: e2e-release ## On a fresh local cluster (root), BENCH_FAILOVER_PODS rounds each: the active pod of an agent-run Deployment deleted, its app failing for good (holder liveness), its template rolled out, the operator's leader SIGKILLed; a client-go Lease's pod deleted; API writes per held lock; prints tables (about 20 minutes).
	RELEASE_DIR=$(E2E_RELEASE) BENCH_FAILOVER_PODS=$(BENCH_FAILOVER_PODS) hack/local-cluster/cluster.sh run $(GO) test -tags e2e -count=1 -timeout 150m -v ./test/e2e/ \
		-ginkgo.v -ginkgo.timeout=150m -ginkgo.focus='pod failover benchmark'

BENCH_MEMORY_FLAGS ?=
.PHONY: bench-memory
bench-memory: envtest ## The manager's memory before and after 1,000 unrelated ConfigMaps and Secrets appear; prints a table.
	KUBEBUILDER_ASSETS="$$($(ENVTEST))" $(GO) run ./hack/benchmemory $(BENCH_MEMORY_FLAGS)

.PHONY: redis
redis: ## Install redis-server from the OS packages when missing.
	@hack/install-redis.sh >/dev/null

.PHONY: prometheus
prometheus: ## Install Debian's prometheus package (prometheus, promtool) when missing.
	@hack/install-prometheus.sh >/dev/null

##@ Build

.PHONY: build
build: ## Build every package, and the binaries (manager, gate, agent, kubectl-redlock) into bin/.
	$(GO) build ./...
	@$(MAKE) --no-print-directory binaries

.PHONY: binaries
binaries: ## Build only the binaries of cmd/ into BIN (default bin/), as the Dockerfile builds them.
	@mkdir -p $(BIN)
	@for c in $(notdir $(wildcard cmd/*)); do echo "build $(BIN)/$$c"; $(GO_BUILD) -o $(BIN)/$$c ./cmd/$$c || exit 1; done

# Where `make install-plugin` puts kubectl-redlock: PREFIX/bin when PREFIX is
# set, else GOBIN (default: $(go env GOPATH)/bin).
PREFIX ?=
PLUGIN_DIR ?= $(if $(PREFIX),$(PREFIX)/bin,$(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin))

.PHONY: install-plugin
install-plugin: ## Build the kubectl plugin kubectl-redlock into GOBIN, or PREFIX/bin with PREFIX=…, beside its completion script kubectl_complete-redlock; `kubectl redlock` finds both on PATH.
	@mkdir -p $(PLUGIN_DIR)
	$(GO_BUILD) -o $(PLUGIN_DIR)/kubectl-redlock ./cmd/kubectl-redlock
	install -m 0755 cmd/kubectl-redlock/kubectl_complete-redlock $(PLUGIN_DIR)/kubectl_complete-redlock
	@echo "installed $(PLUGIN_DIR)/kubectl-redlock and kubectl_complete-redlock: run 'kubectl redlock --help' (with $(PLUGIN_DIR) on PATH)"

.PHONY: release
release: ## Write a release into dist/release/VERSION (make release VERSION=v0.2.0 RELEASE_SIGNING_KEY=FILE): the image for linux/amd64 and arm64 as an OCI layout with SBOMs, install.yaml and the chart naming it by digest, plugin archives and their krew manifest, SHA256SUMS signed; no Docker, no registry (hack/release.sh). CHANGELOG.md must have the version's section.
	@case "$(origin VERSION)" in command\ line|environment) ;; *) echo "release: name it: make release VERSION=vX.Y.Z"; exit 1;; esac
	GO="$(GO)" HELM_KUBE_VERSION=$(HELM_KUBE_VERSION) hack/release.sh $(VERSION)

.PHONY: run
run: manifests generate ## Run the manager against the cluster in ~/.kube/config.
	$(GO) run ./cmd/manager --leader-elect=false

.PHONY: docker-build
docker-build: ## Build the operator image IMG (needs a container engine).
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) -t $(IMG) .

.PHONY: docker-buildx
docker-buildx: ## Build and push the operator image IMG for PLATFORMS (needs docker buildx).
	- $(CONTAINER_TOOL) buildx create --name redlock-operator-builder
	$(CONTAINER_TOOL) buildx use redlock-operator-builder
	- $(CONTAINER_TOOL) buildx build --push --platform=$(PLATFORMS) --build-arg VERSION=$(VERSION) --tag $(IMG) .
	- $(CONTAINER_TOOL) buildx rm redlock-operator-builder

.PHONY: docker-push
docker-push: ## Push the operator image.
	$(CONTAINER_TOOL) push $(IMG)

##@ Local cluster (root, Linux)

DEMO_DURATION ?= 0
.PHONY: demo
demo: ## Show the operator at work on a local single-node cluster it brings up (root, Debian/Ubuntu); DEMO_DURATION=90s runs it bounded.
	DEMO_DURATION=$(DEMO_DURATION) hack/local-cluster/demo.sh

.PHONY: cluster-up
cluster-up: ## Bring up a real single-node cluster (etcd, apiserver, controller-manager, scheduler, kubelet, containerd) on loopback.
	hack/local-cluster/cluster.sh up

# The release make e2e installs: this tree's, for the host's architecture.
E2E_RELEASE ?= $(CURDIR)/bin/e2e-release

.PHONY: e2e-release
e2e-release: ## Write the release make e2e installs into E2E_RELEASE: make release of VERSION (a -dev build off a tag) for linux/GOARCH only, unsigned.
	rm -rf $(E2E_RELEASE)
	OUT=$(E2E_RELEASE) RELEASE_UNSIGNED=1 RELEASE_DIRTY=1 IMAGE_PLATFORMS=linux/$$($(GO) env GOARCH) PLUGIN_PLATFORMS=linux/$$($(GO) env GOARCH) \
		GO="$(GO)" HELM_KUBE_VERSION=$(HELM_KUBE_VERSION) hack/release.sh $(VERSION) >/dev/null

.PHONY: e2e
e2e: e2e-release ## End-to-end suite on a fresh local cluster (root), the operator installed from the host's release (make e2e-release): its image imported from the OCI layout, its chart from the .tgz; managed masters, crashes.
	@mkdir -p $(dir $(E2E_REPORT)) && rm -f $(E2E_REPORT)
	RELEASE_DIR=$(E2E_RELEASE) KUBEBUILDER_ASSETS="$$($(ENVTEST))" hack/local-cluster/cluster.sh run $(GO) test -tags e2e -count=1 -timeout 20m -v ./test/e2e/ -ginkgo.v \
		-ginkgo.json-report=$(E2E_REPORT) $(E2E_ARGS) || { $(GO) run ./hack/failures $(E2E_REPORT); exit 1; }

.PHONY: cluster-down
cluster-down: ## Tear the local cluster down and restore the host.
	hack/local-cluster/cluster.sh down

##@ Deployment

.PHONY: install
install: manifests ## Install the CRDs into the cluster in ~/.kube/config.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: manifests ## Remove the CRDs (and every lock) from the cluster.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: deploy
deploy: manifests ## Deploy the operator (image IMG) into the cluster.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: ## Remove the operator from the cluster.
	$(KUSTOMIZE) build config/default | $(KUBECTL) delete --ignore-not-found -f -
