{{- /* Copied unchanged from crd-ref-docs v0.3.0 (github.com/elastic/crd-ref-docs,
     templates/markdown, Apache License 2.0); see gv_list.tpl. */ -}}
{{- define "type_members" -}}
{{- $field := . -}}
{{- if eq $field.Name "metadata" -}}
Refer to Kubernetes API documentation for fields of `metadata`.
{{- else -}}
{{ markdownRenderFieldDoc $field.Doc }}
{{- end -}}
{{- end -}}
