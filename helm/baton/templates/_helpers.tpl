{{/*
Names and labels. Every helper takes a dict: "baton" holds this chart's values (`.Values` here,
`.Values.baton` in a parent chart) and "context" the caller's root context (`$`), so a parent
chart gets the same names as this chart's own templates.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "baton.name" -}}
{{- default "baton" .baton.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name of the resources: release name and chart name, at most 51 characters, so that
every name the chart derives from it (the longest: FULLNAME-test-health, 12 more) fits in 63
characters without being cut, and no two of them end up the same. */}}
{{- define "baton.fullname" -}}
{{- $full := "" -}}
{{- if .baton.fullnameOverride -}}
{{- $full = .baton.fullnameOverride -}}
{{- else -}}
{{- $name := include "baton.name" . -}}
{{- if contains $name .context.Release.Name -}}
{{- $full = .context.Release.Name -}}
{{- else -}}
{{- $full = printf "%s-%s" .context.Release.Name $name -}}
{{- end -}}
{{- end -}}
{{- regexReplaceAll "[-.]+$" ($full | trunc 51) "" -}}
{{- end -}}

{{/* Labels of every resource this chart renders. */}}
{{- define "baton.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .context.Chart.Name .context.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ include "baton.versionLabel" . | quote }}
app.kubernetes.io/managed-by: {{ .context.Release.Service | quote }}
{{- end -}}

{{/* app.kubernetes.io/version: the image tag made a valid label value (a digest pin's
`@sha256:...` left out, characters a label cannot hold replaced with `-`, at most 63 characters,
beginning and ending with a letter or digit). */}}
{{- define "baton.versionLabel" -}}
{{- $tag := regexReplaceAll "@.*$" (toString .baton.image.tag) "" -}}
{{- $tag = regexReplaceAll "[^-A-Za-z0-9_.]" $tag "-" | trunc 63 -}}
{{- regexReplaceAll "^[^A-Za-z0-9]+|[^A-Za-z0-9]+$" $tag "" -}}
{{- end -}}

{{/* Labels that select this release's resources. */}}
{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" . | quote }}
app.kubernetes.io/instance: {{ .context.Release.Name | quote }}
{{- end -}}

{{/* The Unix socket's path inside the pod. */}}
{{- define "baton.socketPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .baton.socket.dir) .baton.socket.name -}}
{{- end -}}

{{/* Where the Redis password file is mounted. */}}
{{- define "baton.passwordDir" -}}/var/run/secrets/baton/redis{{- end -}}

{{/* Where the Redis CA bundle and client certificate are mounted. */}}
{{- define "baton.redisTlsDir" -}}/var/run/secrets/baton/redis-tls{{- end -}}

{{/* Where Baton's own TLS certificate, key and client CA are mounted. */}}
{{- define "baton.tlsDir" -}}/var/run/secrets/baton/tls{{- end -}}

{{/* Where the API token is mounted, in Baton's container and the app containers. */}}
{{- define "baton.apiTokenDir" -}}/var/run/secrets/baton/api-token{{- end -}}

{{/* The API token file (`--api-token-file`, `BATON_API_TOKEN_FILE`). */}}
{{- define "baton.apiTokenFile" -}}{{ include "baton.apiTokenDir" . }}/token{{- end -}}

{{/* Where the rate limit rules are mounted. */}}
{{- define "baton.rulesDir" -}}/etc/baton/ratelimit{{- end -}}

{{/* The name of the ConfigMap of rate limit rules. */}}
{{- define "baton.rulesConfigMap" -}}
{{- printf "%s-ratelimit" (include "baton.fullname" .) -}}
{{- end -}}

{{/* The name of the demo's Deployment and Service. */}}
{{- define "baton.demoName" -}}
{{- printf "%s-demo" (include "baton.fullname" .) -}}
{{- end -}}

{{/* The name of the demo's evaluation Redis (its Deployment and Service). */}}
{{- define "baton.demoRedisName" -}}
{{- printf "%s-redis" (include "baton.fullname" .) -}}
{{- end -}}

{{/* The Redis URL Baton uses: the demo's Redis when it is deployed, `redis.url` otherwise. */}}
{{- define "baton.redisUrl" -}}
{{- if and .baton.demo.enabled .baton.demo.redis.enabled -}}
{{- printf "redis://%s:6379" (include "baton.demoRedisName" .) -}}
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
{{- include "baton.demoName" . -}}
{{- else -}}
{{- printf "%s-health" (include "baton.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Fails the render on security values that cannot work together. */}}
{{- define "baton.checkSecurity" -}}
{{- $v := .baton -}}
{{- if and $v.tls.existingSecret (ne $v.transport "tcp") -}}
{{- fail "tls.existingSecret needs transport: tcp: TLS is for Baton's TCP listener, and the Unix socket (transport: socket) is plaintext, confined to the pod by the kernel" -}}
{{- end -}}
{{- if and $v.tls.clientCA (not $v.tls.existingSecret) -}}
{{- fail "tls.clientCA (mutual TLS) needs tls.existingSecret: the Secret holding tls.crt, tls.key and the client CA as ca.crt" -}}
{{- end -}}
{{- if and $v.redis.tls.clientCert (not $v.redis.tls.existingSecret) -}}
{{- fail "redis.tls.clientCert needs redis.tls.existingSecret: the Secret holding ca.crt, tls.crt and tls.key" -}}
{{- end -}}
{{- if and (or $v.redis.tls.existingSecret $v.redis.tls.insecure) (not (hasPrefix "rediss://" (include "baton.redisUrl" .))) -}}
{{- fail "redis.tls needs rediss:// Redis URLs (redis.url), and the demo's Redis (demo.redis.enabled) speaks plaintext" -}}
{{- end -}}
{{- if and $v.demo.enabled $v.tls.existingSecret -}}
{{- fail "the demo app talks to Baton without TLS: leave tls.existingSecret empty with demo.enabled" -}}
{{- end -}}
{{- end -}}

{{/* Milliseconds in a duration of the form 500ms, 10s, 2m (the forms the schema accepts). */}}
{{- define "baton.milliseconds" -}}
{{- mulf (include "baton.seconds" . | float64) 1000 -}}
{{- end -}}

{{/* Fails the render when a duration is outside the range Baton accepts for its flag. Takes
(list VALUE-NAME VALUE MIN MAX FLAG OFF), OFF true when 0 (off) is accepted as well. */}}
{{- define "baton.checkDuration" -}}
{{- $name := index . 0 -}}{{- $value := index . 1 -}}{{- $min := index . 2 -}}{{- $max := index . 3 -}}
{{- $flag := index . 4 -}}{{- $off := index . 5 -}}
{{- $ms := include "baton.milliseconds" $value | float64 -}}
{{- if not (and $off (eq $ms 0.0)) -}}
{{- if or (lt $ms (include "baton.milliseconds" $min | float64)) (gt $ms (include "baton.milliseconds" $max | float64)) -}}
{{- fail (printf "%s: %s is outside %s to %s%s, the range Baton accepts (%s)" $name (toString $value) $min $max (ternary " (or 0s: off)" "" $off) $flag) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fails the render on values the schema lets through but Baton (or Kubernetes) would refuse:
durations outside Baton's ranges, listeners sharing a port, Redis URLs Baton does not take, the
socket's path, names, rate limit rules and extra arguments. Included by every workload template
(through "baton.sidecar") and by this chart's own templates. */}}
{{- define "baton.checkValues" -}}
{{- $v := .baton -}}
{{- /* Durations, with the ranges of `baton serve` (its --help and its errors). */ -}}
{{- include "baton.checkDuration" (list "redis.commandTimeout" $v.redis.commandTimeout "10ms" "10s" "--redis-command-timeout" false) -}}
{{- include "baton.checkDuration" (list "redis.connectTimeout" $v.redis.connectTimeout "10ms" "10s" "--redis-connect-timeout" false) -}}
{{- include "baton.checkDuration" (list "redis.minReplicasAckTimeout" $v.redis.minReplicasAckTimeout "1ms" "5s" "--min-replicas-ack-timeout" false) -}}
{{- include "baton.checkDuration" (list "limits.handshakeTimeout" $v.limits.handshakeTimeout "100ms" "10m" "--handshake-timeout" false) -}}
{{- include "baton.checkDuration" (list "credentialsReload" $v.credentialsReload "10ms" "60m" "--credentials-reload" true) -}}
{{- include "baton.checkDuration" (list "rateLimit.timeout" $v.rateLimit.timeout "1ms" "10s" "--ratelimit-timeout" false) -}}
{{- include "baton.checkDuration" (list "rateLimit.reloadInterval" $v.rateLimit.reloadInterval "10ms" "60m" "--ratelimit-config-reload" true) -}}
{{- include "baton.checkDuration" (list "drainTimeout" $v.drainTimeout "0s" "10m" "--drain-timeout" false) -}}
{{- include "baton.checkDuration" (list "shutdownDelay" $v.shutdownDelay "0s" "10m" "--shutdown-delay" false) -}}
{{- /* `baton hold` waits for the lock for --hold-for plus its 10s ttl, and Baton bounds a wait to
1h. */ -}}
{{- include "baton.checkDuration" (list "demo.holdFor" $v.demo.holdFor "0s" "3590s" "the demo app's `baton hold --hold-for`: it waits for the lock that long plus its 10s ttl, and Baton bounds a wait to 1h" false) -}}
{{- /* Listeners: each needs its own port. */ -}}
{{- $ports := dict -}}
{{- $_ := set $ports "health.port" (int64 $v.health.port) -}}
{{- if $v.metrics.enabled -}}{{- $_ := set $ports "metrics.port" (int64 $v.metrics.port) -}}{{- end -}}
{{- if eq $v.transport "tcp" -}}{{- $_ := set $ports "tcp.port" (int64 $v.tcp.port) -}}{{- end -}}
{{- range $a := keys $ports | sortAlpha -}}
{{- range $b := keys $ports | sortAlpha -}}
{{- if and (lt $a $b) (eq (get $ports $a) (get $ports $b)) -}}
{{- fail (printf "%s and %s are both %d: Baton binds each of its listeners on its own port (they would fail with `Address already in use`)" $a $b (get $ports $a)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* Redis URLs: ports in 1..65535, all rediss:// or none, no unix:// seed for a Cluster, a
user in one place (the URL or redis.username), a database that is a number (the path of a
redis:// URL, the `db` parameter of a unix:// one, as Baton reads them). */ -}}
{{- if not (and $v.demo.enabled $v.demo.redis.enabled) -}}
{{- $tls := 0 -}}{{- $plain := 0 -}}
{{- range $u := splitList "," $v.redis.url -}}
{{- $u = trim $u -}}
{{- if hasPrefix "rediss://" $u -}}{{- $tls = add $tls 1 -}}{{- else -}}{{- $plain = add $plain 1 -}}{{- end -}}
{{- if hasPrefix "unix://" $u -}}
{{- if eq $v.redis.mode "cluster" -}}
{{- fail (printf "redis.url: %q is a Unix socket, and every seed of a Redis Cluster (redis.mode: cluster) must be redis://HOST:PORT or rediss://HOST:PORT" $u) -}}
{{- end -}}
{{- $dbs := regexFindAll "[?&]db=[^&#]*" (regexReplaceAll "#.*$" $u "") -1 -}}
{{- if $dbs -}}
{{- $db := regexReplaceAll "^[?&]db=" (last $dbs) "" -}}
{{- if not (regexMatch "^[0-9]{1,18}$" $db) -}}
{{- fail (printf "redis.url: the db parameter of %q, %q, is not a database number (0, 1, ...): Baton refuses the URL" $u $db) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $authority := regexReplaceAll "[/?#].*$" (regexReplaceAll "^rediss?://" $u "") "" -}}
{{- if and (contains "@" $authority) $v.redis.username -}}
{{- fail (printf "redis.url: %q names a user, and so does redis.username (%q): a Redis URL already names a user; give it in one place (Baton refuses both)" $u $v.redis.username) -}}
{{- end -}}
{{- if and (hasPrefix "rediss://" $u) (contains "#" $u) -}}
{{- fail (printf "redis.url: %q has a fragment: Baton takes none on a rediss:// URL but #insecure, and the chart sets that with redis.tls.insecure instead" $u) -}}
{{- end -}}
{{- $db := regexReplaceAll "[?#].*$" (regexReplaceAll "^rediss?://[^/?#]*" $u "") "" | trimAll "/" -}}
{{- if and $db (not (regexMatch "^[0-9]{1,18}$" $db)) -}}
{{- fail (printf "redis.url: the path of %q, %q, is not a database number (/0, /1, ...): Baton refuses the URL" $u $db) -}}
{{- end -}}
{{- $port := regexFind ":[^:\\]]*$" (regexReplaceAll "^.*@" $authority "") -}}
{{- if $port -}}
{{- $port = trimPrefix ":" $port -}}
{{- if or (not (regexMatch "^[0-9]{1,5}$" $port)) (lt (atoi $port) 1) (gt (atoi $port) 65535) -}}
{{- fail (printf "redis.url: the port of %q is %q, not a port from 1 to 65535" $u $port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (gt $tls 0) (gt $plain 0) -}}
{{- fail (printf "redis.url: %q mixes rediss:// (TLS) with other URLs: Baton uses TLS for all of a deployment's connections or for none" $v.redis.url) -}}
{{- end -}}
{{- end -}}
{{- /* The socket: a path that fits a sockaddr_un, a file name, a folder of its own. */ -}}
{{- if eq $v.transport "socket" -}}
{{- $path := include "baton.socketPath" . -}}
{{- if gt (len $path) 107 -}}
{{- fail (printf "socket.dir and socket.name: the socket's path %q is %d bytes, and a Unix socket's path can have at most 107 (clients cannot connect to a longer one)" $path (len $path)) -}}
{{- end -}}
{{- if has $v.socket.name (list "." "..") -}}
{{- fail (printf "socket.name: %q is a folder, not a file name for the socket" $v.socket.name) -}}
{{- end -}}
{{- $dir := clean $v.socket.dir -}}
{{- if eq $dir "/" -}}
{{- fail "socket.dir: / cannot be the socket's folder (an emptyDir mounted over the container's root)" -}}
{{- end -}}
{{- if or (eq $dir "/baton") (hasPrefix "/baton/" $dir) -}}
{{- fail (printf "socket.dir: %q would be mounted on or inside the binary /baton, the image's entrypoint (Baton's and the demo app's): choose another folder, such as /var/run/baton" $v.socket.dir) -}}
{{- end -}}
{{- range $m := list "/proc" "/sys" "/dev" -}}
{{- if or (eq $dir $m) (hasPrefix (printf "%s/" $m) $dir) -}}
{{- fail (printf "socket.dir: %q is on or inside %s, which the container runtime mounts: choose another folder, such as /var/run/baton" $v.socket.dir $m) -}}
{{- end -}}
{{- end -}}
{{- range $m := list (include "baton.passwordDir" .) (include "baton.redisTlsDir" .) (include "baton.tlsDir" .) (include "baton.apiTokenDir" .) (include "baton.rulesDir" .) -}}
{{- if or (eq $dir $m) (hasPrefix (printf "%s/" $m) $dir) (hasPrefix (printf "%s/" $dir) $m) -}}
{{- fail (printf "socket.dir: %q overlaps %q, where the chart mounts one of Baton's Secrets or ConfigMaps: choose another folder" $v.socket.dir $m) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* Names: the Services' names must be DNS-1035 labels. */ -}}
{{- if or $v.demo.enabled $v.tests.enabled (and $v.metrics.enabled $v.metrics.serviceMonitor.enabled) -}}
{{- $full := include "baton.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $full) -}}
{{- fail (printf "the chart's resources would be named %q (from the release name %q, nameOverride and fullnameOverride), and a Service's name must start with a lowercase letter and hold only lowercase letters, digits and '-': set fullnameOverride (or nameOverride) to such a name" $full .context.Release.Name) -}}
{{- end -}}
{{- end -}}
{{- /* The monitors' extra labels: none of the labels the chart sets itself. */ -}}
{{- range $m := list "podMonitor" "serviceMonitor" -}}
{{- range $key, $_ := (get $v.metrics $m).labels -}}
{{- if has $key (list "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by") -}}
{{- fail (printf "metrics.%s.labels: %q is one of the chart's own labels (it sets it on every object): leave it out" $m $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* Rate limit rules: one configuration per domain. */ -}}
{{- $domains := dict -}}
{{- range $v.rateLimit.rules -}}
{{- if hasKey $domains .domain -}}
{{- fail (printf "rateLimit.rules: the domain %q is configured twice (Baton refuses it): merge its descriptors into one entry" .domain) -}}
{{- end -}}
{{- $_ := set $domains .domain true -}}
{{- end -}}
{{- /* Extra arguments: a flag may be given once. */ -}}
{{- $set := dict -}}
{{- range regexFindAll "(?m)^- \"--[a-z0-9-]+" (include "baton.serveArgs" .) -1 -}}
{{- $_ := set $set (trimPrefix "- \"" .) true -}}
{{- end -}}
{{- $extra := dict -}}
{{- range $v.extraArgs -}}
{{- $flag := regexReplaceAll "=.*$" . "" -}}
{{- if hasKey $set $flag -}}
{{- fail (printf "extraArgs: %s is already set by the chart (from its values): set that value instead, since Baton takes each flag once" $flag) -}}
{{- end -}}
{{- if hasKey $extra $flag -}}
{{- fail (printf "extraArgs: %s is given twice, and Baton takes each flag once" $flag) -}}
{{- end -}}
{{- $_ := set $extra $flag true -}}
{{- end -}}
{{- end -}}

{{/* Rewrites, in place, every whole number in a map (and the maps and lists inside it) from a
float to an integer: Helm reads values' numbers as floats, which toYaml writes as 1e+06 from a
million on, where Kubernetes and Baton's rule parser want an integer. Returns nothing. */}}
{{- define "baton.wholeNumbersToInts" -}}
{{- $m := . -}}
{{- range $k, $x := $m -}}
{{- if and (kindIs "float64" $x) (eq (floor $x) $x) (lt $x 9.0e15) (gt $x -9.0e15) -}}
{{- $_ := set $m $k (int64 $x) -}}
{{- else if kindIs "map" $x -}}
{{- include "baton.wholeNumbersToInts" $x -}}
{{- else if kindIs "slice" $x -}}
{{- range $x -}}{{- if kindIs "map" . -}}{{- include "baton.wholeNumbersToInts" . -}}{{- end -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A map as YAML, its whole numbers written as integers ("baton.wholeNumbersToInts"). */}}
{{- define "baton.toYaml" -}}
{{- $copy := deepCopy . -}}
{{- include "baton.wholeNumbersToInts" $copy -}}
{{- toYaml $copy -}}
{{- end -}}

{{/* Baton's container security context (`securityContext`), its user and group IDs integers. */}}
{{- define "baton.securityContext" -}}
{{- include "baton.toYaml" .baton.securityContext -}}
{{- end -}}
