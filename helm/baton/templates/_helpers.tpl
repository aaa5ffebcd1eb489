{{/*
Names and labels. Every helper takes a dict: "baton" holds this chart's values (`.Values` here,
`.Values.baton` in a parent chart) and "context" the caller's root context (`$`), so a parent
chart gets the same names as this chart's own templates.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "baton.name" -}}
{{- default "baton" .baton.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name of the resources: release name and chart name, at most 63 characters. */}}
{{- define "baton.fullname" -}}
{{- if .baton.fullnameOverride -}}
{{- .baton.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "baton.name" . -}}
{{- if contains $name .context.Release.Name -}}
{{- .context.Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .context.Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every resource this chart renders. */}}
{{- define "baton.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .context.Chart.Name .context.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ .baton.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .context.Release.Service }}
{{- end -}}

{{/* Labels that select this release's resources. */}}
{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" . }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
{{- end -}}

{{/* The Unix socket's path inside the pod. */}}
{{- define "baton.socketPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .baton.socket.dir) .baton.socket.name -}}
{{- end -}}

{{/* Where the Redis password file is mounted. */}}
{{- define "baton.passwordDir" -}}/var/run/secrets/baton/redis{{- end -}}

{{/* Where the rate limit rules are mounted. */}}
{{- define "baton.rulesDir" -}}/etc/baton/ratelimit{{- end -}}

{{/* The name of the ConfigMap of rate limit rules. */}}
{{- define "baton.rulesConfigMap" -}}
{{- printf "%s-ratelimit" (include "baton.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Redis URL Baton uses: the demo's Redis when it is deployed, `redis.url` otherwise. */}}
{{- define "baton.redisUrl" -}}
{{- if and .baton.demo.enabled .baton.demo.redis.enabled -}}
{{- printf "redis://%s-redis:6379" (include "baton.fullname" .) -}}
{{- else -}}
{{- .baton.redis.url -}}
{{- end -}}
{{- end -}}

{{/* Seconds in a duration of the form 500ms, 10s, 2m (the forms the schema accepts). */}}
{{- define "baton.seconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "ms" $d -}}{{- divf (trimSuffix "ms" $d | float64) 1000 -}}
{{- else if hasSuffix "s" $d -}}{{- trimSuffix "s" $d | float64 -}}
{{- else if hasSuffix "m" $d -}}{{- mulf (trimSuffix "m" $d | float64) 60 -}}
{{- else -}}{{- fail (printf "%q is not a duration like 500ms, 10s or 2m" $d) -}}
{{- end -}}
{{- end -}}

{{/* Fails the render when the grace period does not cover the shutdown delay and the drain. */}}
{{- define "baton.checkGracePeriod" -}}
{{- $needed := addf (include "baton.seconds" .baton.shutdownDelay | float64) (include "baton.seconds" .baton.drainTimeout | float64) -}}
{{- if le (float64 .baton.terminationGracePeriodSeconds) $needed -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be longer than shutdownDelay (%s) plus drainTimeout (%s), or the kubelet kills Baton before its drain ends" .baton.terminationGracePeriodSeconds .baton.shutdownDelay .baton.drainTimeout) -}}
{{- end -}}
{{- end -}}

{{/* The Service the `helm test` hook reaches Baton through: the demo's, or FULLNAME-health that
selects every pod carrying this Baton. */}}
{{- define "baton.testService" -}}
{{- if .baton.demo.enabled -}}
{{- printf "%s-demo" (include "baton.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-health" (include "baton.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
