{{/* Chart name, truncated to 63 characters (a DNS label). */}}
{{- define "asyncgrpo-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the prefix of every object, `<release>-<chart>` unless the release name already
contains the chart name. Truncated so that derived names ("-webhook-tls") stay under 63 characters.
*/}}
{{- define "asyncgrpo-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "asyncgrpo-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: only name + instance, because selectors are immutable. */}}
{{- define "asyncgrpo-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "asyncgrpo-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The webhook Deployment's pods (a name of their own: no selector of the reconciler's, which
cannot change, may match them). */}}
{{- define "asyncgrpo-operator.webhookSelectorLabels" -}}
app.kubernetes.io/name: {{ include "asyncgrpo-operator.name" . }}-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- /* The selector labels as `k=v,k=v`, for the operator's ASYNCGRPO_OPERATOR_POD_LABELS. */ -}}
{{- define "asyncgrpo-operator.selectorLabelPairs" -}}
{{- $pairs := list }}
{{- range $key, $value := include "asyncgrpo-operator.selectorLabels" . | fromYaml }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{- define "asyncgrpo-operator.labels" -}}
helm.sh/chart: {{ include "asyncgrpo-operator.chart" . }}
{{ include "asyncgrpo-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: asyncgrpo
{{- end }}

{{- define "asyncgrpo-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "asyncgrpo-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "asyncgrpo-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "asyncgrpo-operator.fullname" .) }}
{{- end }}

{{- define "asyncgrpo-operator.webhookSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "asyncgrpo-operator.fullname" .)) .Values.webhook.tls.secretName }}
{{- end }}

{{- define "asyncgrpo-operator.rayTokenKeySecretName" -}}
{{- default (printf "%s-ray-token-key" (include "asyncgrpo-operator.fullname" .)) .Values.rayTokens.keySecret }}
{{- end }}

{{- define "asyncgrpo-operator.webhookCertificateName" -}}
{{- printf "%s-webhook" (include "asyncgrpo-operator.fullname" .) }}
{{- end }}

{{- define "asyncgrpo-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* DNS names the API server may use to reach the webhook Service; all go into the certificate. */}}
{{- define "asyncgrpo-operator.webhookDnsNames" -}}
{{- $svc := include "asyncgrpo-operator.webhookServiceName" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/*
The namespaces the webhook and the admission policy judge: webhook.namespaceSelector when set;
else, with operator.watchNamespaces, those namespaces (an install judges the jobs it runs and no
others: its dry-run may create RayClusters only there, and another install's operator, running
the other namespaces' jobs, must not meet this install's webhook); else all.
*/}}
{{- define "asyncgrpo-operator.admissionNamespaceSelector" -}}
{{- if .Values.webhook.namespaceSelector }}
{{- toYaml .Values.webhook.namespaceSelector }}
{{- else if .Values.operator.watchNamespaces }}
{{- $watched := dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" .Values.operator.watchNamespaces }}
{{- toYaml (dict "matchExpressions" (list $watched)) }}
{{- else }}
{{- toYaml dict }}
{{- end }}
{{- end }}

{{/* Whether jobs that name no Kueue queue are judged (kueue_admission.py): the mutating webhook. */}}
{{- define "asyncgrpo-operator.queueAdmission" -}}
{{- if or .Values.kueue.manageJobsWithoutQueueName .Values.kueue.localQueueDefaulting }}true{{ end }}
{{- end }}

{{/*
The namespaces the mutating webhook judges: those admission judges (above) that Kueue's
managedJobsNamespaceSelector picks too (both selectors' terms, ANDed).
*/}}
{{- define "asyncgrpo-operator.queueNamespaceSelector" -}}
{{- $admission := include "asyncgrpo-operator.admissionNamespaceSelector" . | fromYaml }}
{{- $kueue := .Values.kueue.managedJobsNamespaceSelector }}
{{- $labels := merge (dict) ($admission.matchLabels | default dict) ($kueue.matchLabels | default dict) }}
{{- $expressions := concat ($admission.matchExpressions | default list) ($kueue.matchExpressions | default list) }}
{{- $selector := dict }}
{{- with $labels }}{{- $_ := set $selector "matchLabels" . }}{{- end }}
{{- with $expressions }}{{- $_ := set $selector "matchExpressions" . }}{{- end }}
{{- toYaml $selector }}
{{- end }}

{{/*
Checks the schema cannot express; each fails `helm install` with the value to fix.
*/}}
{{- define "asyncgrpo-operator.validateValues" -}}
{{- if .Values.webhook.url }}
{{- $u := urlParse .Values.webhook.url }}
{{- if ne $u.scheme "https" }}
{{- fail (printf "webhook.url must be an https:// URL (the API server only calls webhooks over TLS); got %q" .Values.webhook.url) }}
{{- end }}
{{- if $u.path }}{{- if ne $u.path "/" }}
{{- fail (printf "webhook.url must not have a path; the chart appends /validate-asyncgrpojob. Got %q" .Values.webhook.url) }}
{{- end }}{{- end }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail (printf "replicaCount %d needs leaderElection.enabled=true: without a leader every replica would reconcile every job" (int .Values.replicaCount)) }}
{{- end }}
{{- if and .Values.webhook.tls.certManager.enabled .Values.webhook.tls.caBundle }}
{{- fail "webhook.tls.caBundle and webhook.tls.certManager.enabled exclude each other: with cert-manager, cainjector sets the caBundle" }}
{{- end }}
{{- if and .Values.webhook.tls.certManager.enabled .Values.webhook.tls.certManager.issuerRef }}
{{- if not .Values.webhook.tls.certManager.issuerRef.name }}
{{- fail "webhook.tls.certManager.issuerRef.name is required when issuerRef is set" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The operator's rules on jobs and their children: in the ClusterRole, or (operator.watchNamespaces)
in a Role per watched namespace.
*/}}
{{- define "asyncgrpo-operator.namespacedRules" -}}
# The jobs: watched (a pass reads them from the watch's cache, never with a GET); deleted after
# ttlSecondsAfterFinished; status written only by us; spec.suspend patched for a job Kueue
# manages (Kueue's gate: true until its Workload is admitted, true again when it is evicted).
- apiGroups: ["asyncgrpo.dev"]
  resources: ["asyncgrpojobs"]
  verbs: ["list", "watch", "delete", "patch"]
- apiGroups: ["asyncgrpo.dev"]
  resources: ["asyncgrpojobs/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion, which clusters running the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift) allow only with this.
- apiGroups: ["asyncgrpo.dev"]
  resources: ["asyncgrpojobs/finalizers"]
  verbs: ["update"]
# What a job owns: one RayCluster per attempt (watched for its conditions; patched to suspend
# and resume it in place) ...
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["create", "list", "watch", "delete", "patch"]
# ... and the ConfigMap with the job spec the driver reads (garbage-collected with the job),
# watched as metadata (the operator's labels only) so a pass compares it with the spec without a
# GET; one of that name in the way is read by a list with a field selector.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create", "patch", "list", "watch"]
# A job Kueue manages owns its Kueue Workload (Kueue's externalFrameworks contract): created,
# its pod sets updated while it holds no quota, deleted when its quota no longer fits the job;
# its status written as a job's controller does (quota given back after an eviction, PodsReady,
# Finished). Watched (those labelled with a job's name), so Kueue's decisions queue the job's
# pass and a pass reads none; without Kueue installed the list answers 404 and the job says so.
# On a MultiKueue worker cluster the copy of a dispatched job finds the Workload MultiKueue
# prebuilt for it in that watch (it carries the manager's labels) and becomes its controller (patch).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
# Each job's Ray token Secret, created before its RayCluster and never read back: the operator
# derives the token from its own key (raytoken.py), so it may read no Secret.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Each job's NetworkPolicy: created with its RayCluster; read and put back as rendered when it
# exists (a create answered 409) and is the job's.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "get", "update"]
# Head pod and driver container state (exit codes, Unschedulable, ImagePullBackOff).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# The operator posts one Event per condition change; kopf posts its handler failures.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if include "asyncgrpo-operator.queueAdmission" . }}
# A job that names no Kueue queue (kueue.manageJobsWithoutQueueName, kueue.localQueueDefaulting):
# the mutating webhook reads whether its namespace has the LocalQueue `default`.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["localqueues"]
  verbs: ["get"]
{{- end }}
{{- end }}
