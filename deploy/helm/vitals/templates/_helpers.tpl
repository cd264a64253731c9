{{/* Names: the release's full name, and one per component. */}}
{{- define "vitals.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vitals.component" -}}
{{- printf "%s-%s" (include "vitals.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vitals.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vitals.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of a component: stable across upgrades (a selector cannot change). */}}
{{- define "vitals.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vitals.labels" -}}
{{ include "vitals.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: vitals
{{- end -}}

{{- define "vitals.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* What every container's env starts with: the pod's name (which later values may name as
     $(POD_NAME): the kubelet expands only variables defined before), the log filter, and the Kafka
     connection: brokers, then the options, the secret ones expanded by the kubelet. */}}
{{- define "vitals.kafkaEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: VITALS_LOG
  value: {{ .Values.logLevel | quote }}
{{- $opts := list -}}
{{- range .Values.kafka.options }}{{ $opts = append $opts . }}{{ end -}}
{{- range $i, $o := .Values.kafka.secretOptions }}
- name: KAFKA_SECRET_OPTION_{{ $i }}
  valueFrom:
    secretKeyRef:
      name: {{ $o.secretName }}
      key: {{ $o.secretKey }}
{{- $opts = append $opts (printf "%s=$(KAFKA_SECRET_OPTION_%d)" $o.option $i) -}}
{{- end }}
{{- if .Values.kafka.tls.secretName -}}
{{- $opts = append $opts "ssl.ca.location=/etc/vitals/kafka-tls/ca.crt" -}}
{{- if .Values.kafka.tls.clientCertificate -}}
{{- $opts = append $opts "ssl.certificate.location=/etc/vitals/kafka-tls/tls.crt" -}}
{{- $opts = append $opts "ssl.key.location=/etc/vitals/kafka-tls/tls.key" -}}
{{- end -}}
{{- end }}
- name: VITALS_KAFKA_BROKERS
  value: {{ .Values.kafka.brokers | quote }}
{{- if $opts }}
- name: VITALS_KAFKA_OPTIONS
  value: {{ join "," $opts | quote }}
{{- end }}
{{- end -}}

{{/* Postgres for a role ("writer" or "reader"). */}}
{{- define "vitals.postgresEnv" -}}
{{- $role := index .root.Values.postgres .role -}}
- name: VITALS_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $role.secretName }}
      key: {{ $role.secretKey }}
- name: VITALS_DB_SCHEMA
  value: {{ .root.Values.postgres.schema | quote }}
{{- end -}}

{{/* The topics a service names: .topics is a list of signals, changes, state, dlq. */}}
{{- define "vitals.topicsEnv" -}}
{{- $t := .root.Values.kafka.topics -}}
{{- $names := dict "signals" "VITALS_SIGNALS_TOPIC" "changes" "VITALS_CHANGES_TOPIC" "state" "VITALS_STATE_TOPIC" "dlq" "VITALS_DLQ_TOPIC" -}}
{{- range .topics }}
- name: {{ index $names . }}
  value: {{ index $t . | quote }}
{{- end }}
{{- end -}}

{{/* The component's extra environment (values: extraEnv), last so that it may name the rest. */}}
{{- define "vitals.commonEnv" -}}
{{- with .extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Mounts every container has: a writable /tmp (the root is read-only) and the Kafka TLS files. */}}
{{- define "vitals.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.tls.secretName }}
- name: kafka-tls
  mountPath: /etc/vitals/kafka-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "vitals.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.kafka.tls.secretName }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* The pod spec's common part: account, security, scheduling. .c is the component's values. */}}
{{- define "vitals.podCommon" -}}
serviceAccountName: {{ include "vitals.serviceAccountName" .root }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* HTTP probes on a named port: live on /healthz, ready on /readyz. */}}
{{- define "vitals.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 6
readinessProbe:
  httpGet:
    path: {{ default "/readyz" .ready }}
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- if .startup }}
startupProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: 2
  failureThreshold: 60
{{- end }}
{{- end -}}

{{/* A PodDisruptionBudget for a component whose values have pdb.enabled. */}}
{{- define "vitals.pdb" -}}
{{- if .c.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "vitals.component" . }}
  labels:
    {{- include "vitals.labels" . | nindent 4 }}
spec:
  {{- if hasKey .c.pdb "minAvailable" }}
  minAvailable: {{ .c.pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ .c.pdb.maxUnavailable }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "vitals.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* A metrics Service, which the ServiceMonitor selects; its job label is the binary's name, as
     deploy/prometheus/vitals-rules.yml expects (job="vitals-processor"). */}}
{{- define "vitals.metricsService" -}}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "vitals.component" . }}-metrics
  labels:
    {{- include "vitals.labels" . | nindent 4 }}
    vitals.dev/metrics: "true"
    vitals.dev/job: {{ .job }}
spec:
  type: ClusterIP
  clusterIP: None
  selector:
    {{- include "vitals.selectorLabels" . | nindent 4 }}
  ports:
    - name: http-metrics
      port: {{ .port }}
      targetPort: {{ .targetPort }}
      protocol: TCP
{{- end -}}
