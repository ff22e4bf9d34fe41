{{/*
Names. Everything is named after the release, so two releases (say, two teams' namespaced
installs) never share a ClusterRole or a peering object. Release "weightcache" gives
"weightcache-operator", the name deploy/operator.yaml has always used.
*/}}
{{- define "weightcache.fullname" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weightcache.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "weightcache.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: set the name of an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Selector labels never change between chart versions: a Deployment's selector is immutable. */}}
{{- define "weightcache.selectorLabels" -}}
app.kubernetes.io/name: weightcache-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "weightcache.labels" -}}
{{ include "weightcache.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: weightcache
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "weightcache.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "weightcache.daemonImage" -}}
{{- printf "%s:%s" .Values.daemon.image.repository (default .Chart.AppVersion .Values.daemon.image.tag) -}}
{{- end -}}

{{/*
RBAC, in two groups so that a namespaced install can grant the first per namespace (Role) and
only the second cluster-wide. tests/unit/chart/helm_chart.py enumerates both; tests/e2e/test_helm_e2e.py
runs the operator with exactly these rules and shows it fails without each group.
*/}}
{{- define "weightcache.namespacedRules" -}}
# The API it serves: read specs, keep kopf's finalizer and annotations, write status.
- apiGroups: [weightcache.io]
  resources: [weightcaches]
  verbs: [get, list, watch, patch]
- apiGroups: [weightcache.io]
  resources: [weightcaches/status]
  verbs: [patch]
# Its own namespace's Pod Security label, read before rendering pods the namespace would refuse.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
# What it creates per cache: engine pods (and their readiness gate), the daemon and GPU holder DaemonSets,
# the Service.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
# One DaemonSet per node slot (parallelism.nodes > 1); stale slots are listed and deleted.
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [get, list, watch, create, patch, delete]
# gpuAccess dra: the template each daemon pod's ResourceClaim is made from. Engines reference the
# generated claims by name, which needs no right on the claims themselves.
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
# The disruption budget over each cache's active engines (watched, and read to apply only where it
# differs; server-side applied: create and patch; the garbage collector deletes it with the cache).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
# Seeding (spec.daemon.seeding): each cache's credential Secret is created when missing (a create
# that finds one is refused, and that is all the operator learns: it reads no Secret); the garbage
# collector deletes it with the cache. The peers ConfigMap is read and server-side applied.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
# kopf posts Kubernetes events about the objects it handles.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.routing.inferencePool.enabled }}
# spec.routing.inferencePool: a pool is read by a LIST (a missing CRD told apart from a missing
# pool); a managed one server-side applied (create and patch) and deleted once the spec stops asking for it.
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [list, create, patch, delete]
{{- end }}
{{- end -}}

{{- define "weightcache.clusterRules" -}}
# Failover watches node readiness; the finalizer force-deletes pods only on nodes that are gone
# or NotReady; with parallelism.nodes > 1 node names and labels decide which node holds which ranks.
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
# kopf: peering between replicas, and noticing CRDs come and go. Writes only to this release's
# peering object, so one release's operators cannot pause another's.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [list, watch]
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  resourceNames: [{{ include "weightcache.fullname" . }}]
  verbs: [get, patch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end -}}
