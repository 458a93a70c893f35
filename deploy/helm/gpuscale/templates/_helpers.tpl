{{/*
A NetworkPolicy peer from {namespace, podLabels}: the pods with those labels in that
namespace; namespace "" means every namespace, podLabels {} every pod there.
*/}}
{{- define "gpuscale.peer" -}}
- namespaceSelector:
  {{- if .namespace }}
    matchLabels: {kubernetes.io/metadata.name: {{ .namespace | quote }}}
  {{- else }} {}
  {{- end }}
  {{- with .podLabels }}
  podSelector:
    matchLabels:
      {{- toYaml . | nindent 6 }}
  {{- end }}
{{- end }}
