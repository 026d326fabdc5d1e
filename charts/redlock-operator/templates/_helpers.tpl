{{/*
Object names are fixed (not derived from the release name) and equal to the
kustomize output's, so that the chart and dist/install.yaml install the same
objects. The operator is cluster-wide: one release per cluster.
*/}}

{{/* The labels Helm adds to every object, next to kustomize's. */}}
{{- define "redlock-operator.helmLabels" -}}
helm.sh/chart: {{ regexReplaceAll "[^A-Za-z0-9]+$" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63) "" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ regexReplaceAll "[^A-Za-z0-9]+$" (.Chart.AppVersion | replace "+" "_" | trunc 63) "" | quote }}
{{- end }}

{{/* The labels of the manager's pods that the Deployment and the Services select. */}}
{{- define "redlock-operator.selectorLabels" -}}
app.kubernetes.io/name: redlock-operator
control-plane: controller-manager
{{- end }}

{{/* The manager's image. */}}
{{- define "redlock-operator.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (.Chart.AppVersion | replace "+" "_") }}
{{- end -}}
{{- end }}

{{/* Values that cannot work together. */}}
{{- define "redlock-operator.validate" -}}
{{- range .Values.watchNamespaces }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .) }}
{{- fail (printf "watchNamespaces: %q is not a namespace name" .) }}
{{- end }}
{{- end }}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicas) 1) }}
{{- fail "leaderElection.enabled=false needs replicas: 1 (two managers would act on the same locks at once)" }}
{{- end }}
{{- if and (not .Values.priorityClass.create) (eq (.Values.priorityClassName | default "") "redlock-operator-critical") }}
{{- fail "priorityClass.create=false renders no PriorityClass redlock-operator-critical: set priorityClassName to a class that exists, or to \"\"" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled" }}
{{- end }}
{{- end }}
