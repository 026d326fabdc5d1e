#!/usr/bin/env bash
# Writes what is derived from the alerting rules and the Grafana dashboard,
# so that each has one source:
#   config/prometheus/prometheusrule.yaml  the rules' groups in a PrometheusRule
#   CHART/files/rules.yaml                 the chart's copy of the rules
#   CHART/files/redlock-operator.json      the chart's copy of the dashboard
# Usage: hack/monitoring.sh [CHART]   (default charts/redlock-operator)
set -euo pipefail
cd "$(dirname "$0")/.."
chart=${1:-charts/redlock-operator}
rules=config/prometheus/rules.yaml
dashboard=config/grafana/redlock-operator.json

{
	cat <<'HEAD'
# Generated from rules.yaml by make monitoring: edit rules.yaml.
# The operator's alerts for the Prometheus Operator; add ../prometheus to
# config/default's resources (with monitor.yaml), or set
# metrics.prometheusRule.enabled in the Helm chart.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: alerts
  namespace: redlock-system
  labels:
    app.kubernetes.io/name: redlock-operator
spec:
HEAD
	# The groups, without rules.yaml's leading comment.
	sed -n '/^groups:/,$p' "$rules" | sed 's/^/  /'
} >config/prometheus/prometheusrule.yaml

mkdir -p "$chart/files"
cp "$rules" "$chart/files/rules.yaml"
cp "$dashboard" "$chart/files/redlock-operator.json"
