{{/* The name every object of a release starts with. */}}
{{- define "sandfork.fullname" -}}
{{ .Release.Name }}-sandfork
{{- end }}

{{/* Labels every object carries. */}}
{{- define "sandfork.labels" -}}
app.kubernetes.io/name: sandfork
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* The labels that select the gateways' pods (their selectors' and the pods' own). */}}
{{- define "sandfork.gatewayPods" -}}
app.kubernetes.io/name: sandfork
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The same for the nodes' pods (not the Kubernetes nodes they run on: node.nodeSelector). */}}
{{- define "sandfork.nodePods" -}}
app.kubernetes.io/name: sandfork
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end }}

{{/* The environment gateways and nodes share: the database and the cluster's certificates. */}}
{{- define "sandfork.commonEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.key }}
- name: SANDFORK_CLUSTER_CA
  value: /etc/sandfork/tls/ca.crt
- name: SANDFORK_CLUSTER_CERT
  value: /etc/sandfork/tls/tls.crt
- name: SANDFORK_CLUSTER_KEY
  value: /etc/sandfork/tls/tls.key
{{- end }}
