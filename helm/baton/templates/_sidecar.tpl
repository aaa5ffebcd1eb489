{{/*
The pieces a pod needs to run Baton beside its app containers. A parent chart that depends on
this one (as `baton`) includes them in its pod template, each with
`(dict "baton" .Values.baton "context" $)`:

  metadata:
    labels: {{- include "baton.podLabels" $b | nindent 8 }}
    annotations: {{- include "baton.podAnnotations" $b | nindent 8 }}
  spec:
    terminationGracePeriodSeconds: {{ include "baton.terminationGracePeriodSeconds" $b }}
    securityContext: {{- include "baton.podSecurityContext" $b | nindent 6 }}
    {{- with include "baton.initContainers" $b }}
    initContainers: {{- . | nindent 6 }}
    {{- end }}
    containers:
      {{- include "baton.containers" $b | nindent 6 }}
      - name: app
        env: {{- include "baton.appEnv" $b | nindent 10 }}
        volumeMounts: {{- include "baton.appVolumeMounts" $b | nindent 10 }}
    volumes: {{- include "baton.volumes" $b | nindent 6 }}

"baton.initContainers" is Baton as a native sidecar (`nativeSidecar: true`) and nothing otherwise;
"baton.containers" is Baton as an ordinary container (`nativeSidecar: false`) and nothing
otherwise. Your own init containers or containers go after them in the same lists.
*/}}

{{/* The pod's `initContainers` items Baton adds: itself as a native sidecar, or nothing. */}}
{{- define "baton.initContainers" -}}
{{- if .baton.nativeSidecar -}}
{{- include "baton.sidecar" . -}}
{{- end -}}
{{- end -}}

{{/* The pod's `containers` items Baton adds: itself as an ordinary container (`nativeSidecar:
false`), or nothing. */}}
{{- define "baton.containers" -}}
{{- if not .baton.nativeSidecar -}}
{{- include "baton.sidecar" . -}}
{{- end -}}
{{- end -}}

{{/* Baton's container, as a list item: a native sidecar (`restartPolicy: Always`) when
`nativeSidecar` is true. Pods include it through "baton.initContainers" and "baton.containers". */}}
{{- define "baton.sidecar" -}}
{{- $v := .baton -}}
{{- include "baton.checkGracePeriod" . -}}
{{- include "baton.checkSecurity" . -}}
{{- include "baton.checkValues" . -}}
- name: baton
  image: {{ printf "%s:%s" $v.image.repository $v.image.tag | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy | quote }}
  {{- if $v.nativeSidecar }}
  restartPolicy: Always
  {{- end }}
  command:
    - /baton
  args:
    {{- include "baton.serveArgs" . | nindent 4 }}
    {{- range $v.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  ports:
    - name: grpc-health
      containerPort: {{ $v.health.port }}
      protocol: TCP
    {{- if $v.metrics.enabled }}
    - name: metrics
      containerPort: {{ $v.metrics.port }}
      protocol: TCP
    {{- end }}
  startupProbe:
    grpc:
      port: {{ $v.health.port }}
      service: {{ $v.probes.startup.service | quote }}
    periodSeconds: {{ $v.probes.startup.periodSeconds }}
    failureThreshold: {{ $v.probes.startup.failureThreshold }}
    timeoutSeconds: {{ $v.probes.timeoutSeconds }}
  readinessProbe:
    grpc:
      port: {{ $v.health.port }}
      service: readiness
    periodSeconds: {{ $v.probes.readiness.periodSeconds }}
    failureThreshold: {{ $v.probes.readiness.failureThreshold }}
    timeoutSeconds: {{ $v.probes.timeoutSeconds }}
  livenessProbe:
    grpc:
      port: {{ $v.health.port }}
      service: liveness
    periodSeconds: {{ $v.probes.liveness.periodSeconds }}
    failureThreshold: {{ $v.probes.liveness.failureThreshold }}
    timeoutSeconds: {{ $v.probes.timeoutSeconds }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    {{- include "baton.securityContext" . | nindent 4 }}
  volumeMounts:
    {{- if eq $v.transport "socket" }}
    - name: baton-socket
      mountPath: {{ $v.socket.dir | quote }}
    {{- end }}
    {{- if $v.redis.password.existingSecret }}
    - name: baton-redis-password
      mountPath: {{ include "baton.passwordDir" . | quote }}
      readOnly: true
    {{- end }}
    {{- if $v.redis.tls.existingSecret }}
    - name: baton-redis-tls
      mountPath: {{ include "baton.redisTlsDir" . | quote }}
      readOnly: true
    {{- end }}
    {{- if $v.tls.existingSecret }}
    - name: baton-tls
      mountPath: {{ include "baton.tlsDir" . | quote }}
      readOnly: true
    {{- end }}
    {{- if $v.apiToken.existingSecret }}
    - name: baton-api-token
      mountPath: {{ include "baton.apiTokenDir" . | quote }}
      readOnly: true
    {{- end }}
    {{- if $v.rateLimit.rules }}
    - name: baton-ratelimit
      mountPath: {{ include "baton.rulesDir" . | quote }}
      readOnly: true
    {{- end }}
    {{- if not (or (eq $v.transport "socket") $v.redis.password.existingSecret $v.redis.tls.existingSecret $v.tls.existingSecret $v.apiToken.existingSecret $v.rateLimit.rules) }} []{{ end }}
{{- end -}}

{{/* The arguments of `baton serve` the chart sets from its values (`extraArgs` follow them), as
list items. */}}
{{- define "baton.serveArgs" -}}
{{- $v := .baton -}}
- serve
{{- if eq $v.transport "socket" }}
- "--listen="
- {{ printf "--socket=%v" (include "baton.socketPath" .) | quote }}
- {{ printf "--socket-mode=%v" ($v.socket.mode) | quote }}
- {{ printf "--socket-group=%v" (int64 $v.socket.group) | quote }}
{{- else }}
- {{ printf "--listen=127.0.0.1:%v" ($v.tcp.port) | quote }}
{{- end }}
- {{ printf "--health-listen=%v:%v" ($v.health.address) ($v.health.port) | quote }}
- {{ printf "--redis-mode=%v" ($v.redis.mode) | quote }}
- {{ printf "--redis-url=%v" (include "baton.redisUrl" .) | quote }}
{{- if eq $v.redis.mode "sentinel" }}
- {{ printf "--redis-sentinel-master=%v" ($v.redis.sentinelMaster) | quote }}
{{- end }}
{{- if $v.redis.username }}
- {{ printf "--redis-username=%v" $v.redis.username | quote }}
{{- end }}
{{- if $v.redis.password.existingSecret }}
- {{ printf "--redis-password-file=%v/password" (include "baton.passwordDir" .) | quote }}
{{- end }}
{{- if $v.redis.tls.existingSecret }}
- {{ printf "--redis-tls-ca=%v/ca.crt" (include "baton.redisTlsDir" .) | quote }}
{{- if $v.redis.tls.clientCert }}
- {{ printf "--redis-tls-cert=%v/tls.crt" (include "baton.redisTlsDir" .) | quote }}
- {{ printf "--redis-tls-key=%v/tls.key" (include "baton.redisTlsDir" .) | quote }}
{{- end }}
{{- end }}
{{- if $v.redis.tls.insecure }}
- "--redis-tls-insecure"
{{- end }}
{{- if $v.tls.existingSecret }}
- {{ printf "--tls-cert=%v/tls.crt" (include "baton.tlsDir" .) | quote }}
- {{ printf "--tls-key=%v/tls.key" (include "baton.tlsDir" .) | quote }}
{{- if $v.tls.clientCA }}
- {{ printf "--tls-client-ca=%v/ca.crt" (include "baton.tlsDir" .) | quote }}
{{- end }}
{{- end }}
{{- if $v.apiToken.existingSecret }}
- {{ printf "--api-token-file=%v" (include "baton.apiTokenFile" .) | quote }}
{{- end }}
- {{ printf "--credentials-reload=%v" $v.credentialsReload | quote }}
- {{ printf "--key-prefix=%v" ($v.redis.keyPrefix) | quote }}
- {{ printf "--min-replicas-ack=%v" ($v.redis.minReplicasAck) | quote }}
- {{ printf "--min-replicas-ack-timeout=%v" ($v.redis.minReplicasAckTimeout) | quote }}
- {{ printf "--redis-connect-timeout=%v" ($v.redis.connectTimeout) | quote }}
- {{ printf "--redis-command-timeout=%v" ($v.redis.commandTimeout) | quote }}
- {{ printf "--redis-pool-size=%v" ($v.redis.poolSize) | quote }}
- {{ printf "--ratelimit-timeout=%v" ($v.rateLimit.timeout) | quote }}
- {{ printf "--ratelimit-failure-mode=%v" ($v.rateLimit.failureMode) | quote }}
{{- if $v.rateLimit.rules }}
- {{ printf "--ratelimit-config=%v" (include "baton.rulesDir" .) | quote }}
- {{ printf "--ratelimit-config-reload=%v" ($v.rateLimit.reloadInterval) | quote }}
{{- end }}
- {{ printf "--max-connections=%v" (int64 $v.limits.maxConnections) | quote }}
- {{ printf "--max-concurrent-streams=%v" (int64 $v.limits.maxConcurrentStreams) | quote }}
- {{ printf "--max-lease-streams=%v" (int64 $v.limits.maxLeaseStreams) | quote }}
- {{ printf "--max-waiters=%v" (int64 $v.limits.maxWaiters) | quote }}
- {{ printf "--max-message-size=%v" (int64 $v.limits.maxMessageSize) | quote }}
- {{ printf "--handshake-timeout=%v" ($v.limits.handshakeTimeout) | quote }}
- {{ printf "--drain-timeout=%v" ($v.drainTimeout) | quote }}
- {{ printf "--shutdown-delay=%v" ($v.shutdownDelay) | quote }}
- {{ printf "--log-format=%v" ($v.log.format) | quote }}
- {{ printf "--log=%v" ($v.log.level) | quote }}
{{- if $v.metrics.enabled }}
- {{ printf "--metrics-listen=%v:%v" ($v.health.address) ($v.metrics.port) | quote }}
{{- end }}
{{- end -}}

{{/* The pod's volumes Baton uses, as list items (an empty list when it uses none). */}}
{{- define "baton.volumes" -}}
{{- $v := .baton -}}
{{- if eq $v.transport "socket" }}
- name: baton-socket
  emptyDir:
    medium: Memory
    sizeLimit: {{ $v.socket.sizeLimit | quote }}
{{- end }}
{{- if $v.redis.password.existingSecret }}
- name: baton-redis-password
  secret:
    secretName: {{ $v.redis.password.existingSecret | quote }}
    defaultMode: 0440
    items:
      - key: {{ $v.redis.password.key | quote }}
        path: password
{{- end }}
{{- if $v.redis.tls.existingSecret }}
- name: baton-redis-tls
  secret:
    secretName: {{ $v.redis.tls.existingSecret | quote }}
    defaultMode: 0440
    items:
      - key: ca.crt
        path: ca.crt
      {{- if $v.redis.tls.clientCert }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
{{- end }}
{{- if $v.tls.existingSecret }}
- name: baton-tls
  secret:
    secretName: {{ $v.tls.existingSecret | quote }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- if $v.tls.clientCA }}
      - key: ca.crt
        path: ca.crt
      {{- end }}
{{- end }}
{{- if $v.apiToken.existingSecret }}
- name: baton-api-token
  secret:
    secretName: {{ $v.apiToken.existingSecret | quote }}
    defaultMode: 0440
    items:
      - key: {{ $v.apiToken.key | quote }}
        path: token
{{- end }}
{{- if $v.rateLimit.rules }}
- name: baton-ratelimit
  configMap:
    name: {{ include "baton.rulesConfigMap" . | quote }}
{{- end }}
{{- if not (or (eq $v.transport "socket") $v.redis.password.existingSecret $v.redis.tls.existingSecret $v.tls.existingSecret $v.apiToken.existingSecret $v.rateLimit.rules) }} []{{ end }}
{{- end -}}

{{/* The environment an app container needs to find Baton, as list items. */}}
{{- define "baton.appEnv" -}}
{{- $v := .baton -}}
- name: BATON_ADDR
  {{- if eq $v.transport "socket" }}
  value: {{ printf "unix://%s" (include "baton.socketPath" .) | quote }}
  {{- else }}
  value: {{ printf "127.0.0.1:%v" $v.tcp.port | quote }}
  {{- end }}
{{- if $v.apiToken.existingSecret }}
- name: BATON_API_TOKEN_FILE
  value: {{ include "baton.apiTokenFile" . | quote }}
{{- end }}
{{- end -}}

{{/* The volume mounts an app container needs to reach Baton, as list items (an empty list over
TCP without an API token): the socket's folder, the API token's. */}}
{{- define "baton.appVolumeMounts" -}}
{{- $v := .baton -}}
{{- if eq $v.transport "socket" }}
- name: baton-socket
  mountPath: {{ $v.socket.dir | quote }}
{{- end }}
{{- if $v.apiToken.existingSecret }}
- name: baton-api-token
  mountPath: {{ include "baton.apiTokenDir" . | quote }}
  readOnly: true
{{- end }}
{{- if not (or (eq $v.transport "socket") $v.apiToken.existingSecret) }} []{{ end }}
{{- end -}}

{{/* The pod security context Baton needs: the socket's group as fsGroup. */}}
{{- define "baton.podSecurityContext" -}}
fsGroup: {{ int64 .baton.socket.group }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The label that marks pods carrying this Baton (the PodMonitor and the metrics Service select
it). */}}
{{- define "baton.podLabels" -}}
baton-sidecar: {{ include "baton.fullname" . | quote }}
{{- end -}}

{{/* The pod's annotations Baton adds (an empty map when there are none): Prometheus scrape
annotations with metrics, and with rate limit rules and `rateLimit.rollOnChange`
`checksum/baton-ratelimit`, the SHA-256 of the rules ConfigMap's content, so that a `helm upgrade`
changing the rules rolls the pods (by default a running Baton rereads the mounted rules on its
own, and the app's pods are not restarted for a rules change). */}}
{{- define "baton.podAnnotations" -}}
{{- $v := .baton -}}
{{- $metrics := and $v.metrics.enabled $v.metrics.annotations -}}
{{- if $metrics }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ $v.metrics.port | quote }}
prometheus.io/path: "/metrics"
{{- end }}
{{- $roll := and $v.rateLimit.rules $v.rateLimit.rollOnChange -}}
{{- if $roll }}
checksum/baton-ratelimit: {{ include "baton.rulesData" . | sha256sum | quote }}
{{- end }}
{{- if not (or $metrics $roll) }} {}
{{- end }}
{{- end -}}

{{/* The pod's grace period, checked against the shutdown delay and the drain. */}}
{{- define "baton.terminationGracePeriodSeconds" -}}
{{- include "baton.checkGracePeriod" . -}}
{{- .baton.terminationGracePeriodSeconds -}}
{{- end -}}
