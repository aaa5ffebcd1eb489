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

{{/* The data of the ConfigMap of rate limit rules: one file per domain, `NN-DOMAIN.yaml`. The pod
annotation `checksum/baton-ratelimit` ("baton.podAnnotations", with `rateLimit.rollOnChange`) is
the SHA-256 of this text. */}}
{{- define "baton.rulesData" -}}
{{- range $i, $rule := .baton.rateLimit.rules -}}
{{ printf "%02d-%s.yaml" $i (toString $rule.domain) | quote }}: |
  {{- include "baton.toYaml" $rule | nindent 2 }}
{{ end -}}
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
{{- include "baton.checkSecurityContext" . -}}
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

{{/* Fails the render when a Redis URL carries a credential, which would land in Baton's
arguments, where anyone who can read the pod spec or the process list sees it: a password in the
user part (`redis://USER:PASSWORD@HOST`, `redis://:PASSWORD@HOST`), a `pass` or `password` query
parameter (how a `unix://` URL carries one; any case, on any URL), a `user` or `username` query
parameter, or a user part or query parameter name written with `%` escapes (which Baton decodes). Takes (list URL VALUES). A user
alone in the user part (`redis://USER@HOST`) is a name, not a secret, and renders. */}}
{{- define "baton.checkUrlCredentials" -}}
{{- $u := index . 0 -}}{{- $v := index . 1 -}}
{{- $noFragment := regexReplaceAll "#.*$" $u "" -}}
{{- $authority := regexReplaceAll "[/?].*$" (regexReplaceAll "^[A-Za-z][A-Za-z0-9+.-]*://" $noFragment "") "" -}}
{{- if contains "@" $authority -}}
{{- $userinfo := regexReplaceAll "@[^@]*$" $authority "" -}}
{{- if or (contains ":" $userinfo) (contains "%" $userinfo) -}}
{{- fail (printf "redis.url: a URL carries a password in its user part (USER:PASSWORD@, or a %%-escaped user), which would be in Baton's arguments for anyone who can read the pod: put the password in a Secret and name it in redis.password.existingSecret (and its key in redis.password.key), the user in redis.username") -}}
{{- end -}}
{{- end -}}
{{- if contains "?" $noFragment -}}
{{- range $pair := splitList "&" (regexReplaceAll "^[^?]*\\?" $noFragment "") -}}
{{- $key := lower (regexReplaceAll "=.*$" $pair "") -}}
{{- if contains "%" $key -}}
{{- fail (printf "redis.url: the query parameter %q is written with %% escapes: write its name plainly (a password or user never goes in the URL: see redis.password.existingSecret and redis.username)" (regexReplaceAll "=.*$" $pair "")) -}}
{{- end -}}
{{- if has $key (list "pass" "password") -}}
{{- fail (printf "redis.url: a URL carries a password (its %s parameter), which would be in Baton's arguments for anyone who can read the pod: put the password in a Secret and name it in redis.password.existingSecret (and its key in redis.password.key)" (regexReplaceAll "=.*$" $pair "")) -}}
{{- end -}}
{{- if has $key (list "user" "username") -}}
{{- fail (printf "redis.url: a URL names a user in its %s parameter: give the user in redis.username (and the password in the Secret named by redis.password.existingSecret)" (regexReplaceAll "=.*$" $pair "")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A rule's text as Baton reads it from the ConfigMap: a scalar's text, "" for null. */}}
{{- define "baton.ruleText" -}}
{{- if kindIs "invalid" . -}}{{- else if kindIs "float64" . -}}{{- if eq (floor .) . -}}{{- int64 . -}}{{- else -}}{{- . -}}{{- end -}}{{- else -}}{{- toString . -}}{{- end -}}
{{- end -}}

{{/* Milliseconds in a rate limit rule's `period`, or "" when the chart cannot read it: whole
numbers with units, as Baton's parser (humantime) reads them (`1500ms`, `90s`, `1h 30m`, `2days`;
months of 30.44 days, years of 365.25 days). Fractions of a unit and a part of a millisecond
(from ns or us) yield "", as does an unknown unit. */}}
{{- define "baton.periodMilliseconds" -}}
{{- $units := dict "ms" 1 "msec" 1 "millis" 1 "s" 1000 "sec" 1000 "secs" 1000 "second" 1000 "seconds" 1000 "m" 60000 "min" 60000 "mins" 60000 "minute" 60000 "minutes" 60000 "h" 3600000 "hr" 3600000 "hrs" 3600000 "hour" 3600000 "hours" 3600000 "d" 86400000 "day" 86400000 "days" 86400000 "w" 604800000 "wk" 604800000 "wks" 604800000 "week" 604800000 "weeks" 604800000 "M" 2630016000 "month" 2630016000 "months" 2630016000 "y" 31557600000 "yr" 31557600000 "yrs" 31557600000 "year" 31557600000 "years" 31557600000 -}}
{{- $small := dict "ns" 1 "nsec" 1 "nanos" 1 "us" 1000 "usec" 1000 "µs" 1000 -}}
{{- $text := toString . -}}
{{- if regexMatch "^ *([0-9]{1,12} *([A-Za-z]+|µs) *)+$" $text -}}
{{- $ms := 0.0 -}}{{- $ns := 0 -}}{{- $ok := true -}}
{{- range $part := regexFindAll "[0-9]+ *([A-Za-z]+|µs)" $text -1 -}}
{{- $unit := regexReplaceAll "^[0-9]+ *" $part "" -}}
{{- $n := regexReplaceAll " *([A-Za-z]+|µs)$" $part "" -}}
{{- if hasKey $units $unit -}}
{{- $ms = addf $ms (mulf ($n | float64) (get $units $unit)) -}}
{{- else if hasKey $small $unit -}}
{{- $ns = add $ns (mul (atoi $n) (get $small $unit)) -}}
{{- else -}}{{- $ok = false -}}
{{- end -}}
{{- end -}}
{{- if and $ok (eq (mod $ns 1000000) 0) -}}{{- printf "%.0f" (addf $ms (div $ns 1000000)) -}}{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fails the render on rate limit descriptors Baton refuses when it loads the rules (at start it
then exits, and a running Baton keeps its old rules), with the descriptor's path: a key and value
given twice at one level, and `rate_limit` blocks Baton cannot compile (src/ratelimit/rules.rs).
Takes (list PATH DESCRIPTORS); checks nested descriptors the same way. */}}
{{- define "baton.checkDescriptors" -}}
{{- $path := index . 0 -}}{{- $descriptors := index . 1 -}}
{{- $seen := dict -}}
{{- range $i, $d := $descriptors -}}
{{- $at := printf "%s[%d]" $path $i -}}
{{- $key := include "baton.ruleText" $d.key -}}
{{- $value := include "baton.ruleText" $d.value -}}
{{- $id := printf "%d:%s=%s" (len $key) $key $value -}}
{{- if hasKey $seen $id -}}
{{- fail (printf "%s: key %q%s is given twice at this level (also at [%d]), and Baton refuses duplicate rules: merge them" $at $key (ternary "" (printf " with value %q" $value) (eq $value "")) (get $seen $id)) -}}
{{- end -}}
{{- $_ := set $seen $id $i -}}
{{- $rl := $d.rate_limit -}}
{{- if kindIs "map" $rl -}}
{{- $has := dict -}}
{{- range $f := list "unit" "period" "requests_per_unit" "algorithm" "burst" -}}
{{- if and (hasKey $rl $f) (not (kindIs "invalid" (get $rl $f))) -}}{{- $_ := set $has $f true -}}{{- end -}}
{{- end -}}
{{- if and (kindIs "bool" $rl.unlimited) $rl.unlimited -}}
{{- if $has -}}
{{- fail (printf "%s.rate_limit: unlimited: true takes no unit, period, requests_per_unit, algorithm or burst (it has %s), and Baton refuses the rules" $at (keys $has | sortAlpha | join ", ")) -}}
{{- end -}}
{{- else -}}
{{- if and $has.unit $has.period -}}
{{- fail (printf "%s.rate_limit: give either unit or period, not both (Baton refuses the rules)" $at) -}}
{{- end -}}
{{- if not (or $has.unit $has.period) -}}
{{- fail (printf "%s.rate_limit: needs unit (second, minute, hour, day, week, month, year) or period (such as 1500ms), or unlimited: true (Baton refuses the rules)" $at) -}}
{{- end -}}
{{- if not $has.requests_per_unit -}}
{{- fail (printf "%s.rate_limit: needs requests_per_unit (0 denies everything), or unlimited: true (Baton refuses the rules)" $at) -}}
{{- end -}}
{{- if $has.period -}}
{{- $ms := include "baton.periodMilliseconds" $rl.period -}}
{{- if not $ms -}}
{{- fail (printf "%s.rate_limit.period: %q is not a whole number of milliseconds written as whole numbers with units, such as 1500ms, 90s or 1h 30m (Baton refuses a period it cannot read or one with a part of a millisecond; the chart also refuses fractions such as 1.5s)" $at (toString $rl.period)) -}}
{{- end -}}
{{- if or (lt ($ms | float64) 1.0) (gt ($ms | float64) 31622400000.0) -}}
{{- fail (printf "%s.rate_limit.period: %q is outside 1ms to 366 days, the periods Baton takes" $at (toString $rl.period)) -}}
{{- end -}}
{{- end -}}
{{- if and $has.burst (ne (toString $rl.algorithm) "gcra") -}}
{{- fail (printf "%s.rate_limit.burst: applies to algorithm: gcra only (this rule's algorithm is %s), and Baton refuses the rules" $at (ternary "fixed_window, the default" (toString $rl.algorithm) (not $has.algorithm))) -}}
{{- end -}}
{{- if and (eq (toString $rl.algorithm) "sliding_window") (gt (float64 $rl.requests_per_unit) 10000.0) -}}
{{- fail (printf "%s.rate_limit.requests_per_unit: %s is more than 10000, the most a sliding_window rule takes (it keeps every unit spent in Redis)" $at (include "baton.ruleText" $rl.requests_per_unit)) -}}
{{- end -}}
{{- end -}}
{{- $name := include "baton.ruleText" $rl.name -}}
{{- range $r := $rl.replaces | default list -}}
{{- $rname := include "baton.ruleText" (get $r "name") -}}
{{- if eq $rname "" -}}
{{- fail (printf "%s.rate_limit.replaces: a name must not be empty (Baton refuses the rules)" $at) -}}
{{- end -}}
{{- if eq $rname $name -}}
{{- fail (printf "%s.rate_limit.replaces: %q is this rule's own name (Baton refuses the rules)" $at $rname) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- include "baton.checkDescriptors" (list (printf "%s.descriptors" $at) ($d.descriptors | default list)) -}}
{{- end -}}
{{- end -}}

{{/* A Kubernetes quantity (`50m`, `0.5`, `64Mi`, `1G`, `1e3`, or a number) as a number, for
comparing a request with its limit. */}}
{{- define "baton.quantity" -}}
{{- $q := toString . | trimPrefix "+" -}}
{{- $suffixes := dict "n" 1e-9 "u" 1e-6 "m" 1e-3 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $number := regexFind "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" $q -}}
{{- $suffix := trimPrefix $number $q -}}
{{- if hasKey $suffixes $suffix -}}
{{- mulf ($number | float64) (get $suffixes $suffix) -}}
{{- else if regexMatch "^[eE][-+]?[0-9]+$" $suffix -}}
{{- mulf ($number | float64) (printf "1%s" $suffix | float64) -}}
{{- else -}}
{{- $number | float64 -}}
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
{{- include "baton.checkUrlCredentials" (list $u $v) -}}
{{- if hasPrefix "rediss://" $u -}}{{- $tls = add $tls 1 -}}{{- else -}}{{- $plain = add $plain 1 -}}{{- end -}}
{{- if hasPrefix "unix://" $u -}}
{{- if eq $v.redis.mode "cluster" -}}
{{- fail (printf "redis.url: %q is a Unix socket, and every seed of a Redis Cluster (redis.mode: cluster) must be redis://HOST:PORT or rediss://HOST:PORT" $u) -}}
{{- end -}}
{{- if not (regexMatch "^unix:///[^?#]" $u) -}}
{{- fail (printf "redis.url: %q is not unix:///PATH with an absolute path (three slashes: after unix:// a name such as tmp/ is read as a host, and Baton refuses the URL)" $u) -}}
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
{{- if not (regexReplaceAll ":[0-9]*$" (regexReplaceAll "^.*@" $authority "") "") -}}
{{- fail (printf "redis.url: %q names no host: write redis://HOST:PORT (or rediss://)" $u) -}}
{{- end -}}
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
{{- fail "socket.dir: / cannot be the socket's folder (an emptyDir mounted over the container's root hides the binary and its libraries): choose a folder of its own under /run, /var/run or /tmp (the default is /var/run/baton), or a new top-level folder such as /baton-socket" -}}
{{- end -}}
{{- if or (eq $dir "/baton") (hasPrefix "/baton/" $dir) -}}
{{- fail (printf "socket.dir: %q would be mounted on or inside the binary /baton, the image's entrypoint (Baton's and the demo app's): choose a folder of its own under /run, /var/run or /tmp (the default is /var/run/baton), or a new top-level folder such as /baton-socket" $v.socket.dir) -}}
{{- end -}}
{{- range $m := list (include "baton.passwordDir" .) (include "baton.redisTlsDir" .) (include "baton.tlsDir" .) (include "baton.apiTokenDir" .) (include "baton.rulesDir" .) -}}
{{- if or (eq $dir $m) (hasPrefix (printf "%s/" $m) $dir) (hasPrefix (printf "%s/" $dir) $m) -}}
{{- fail (printf "socket.dir: %q overlaps %q, where the chart mounts one of Baton's Secrets or ConfigMaps: choose a folder of its own under /run, /var/run or /tmp (the default is /var/run/baton), or a new top-level folder such as /baton-socket" $v.socket.dir $m) -}}
{{- end -}}
{{- end -}}
{{- /* What the image ships (the Dockerfile copies /baton and the shared libraries it maps, under
/lib, /lib64 and, on other layouts, /usr/lib, /lib32, /libx32), the runtime's and the kubelet's
mounts (/proc, /sys, /dev, /etc's hosts, hostname and resolv.conf, the service account token
under /var/run/secrets/kubernetes.io) and the usual system folders: the emptyDir must be neither one of them,
nor inside one, nor above one. */ -}}
{{- range $m := list "/lib" "/lib64" "/lib32" "/libx32" "/usr" "/bin" "/sbin" "/etc" "/proc" "/sys" "/dev" "/var/run/secrets/kubernetes.io" -}}
{{- if or (eq $dir $m) (hasPrefix (printf "%s/" $m) $dir) (hasPrefix (printf "%s/" $dir) $m) -}}
{{- fail (printf "socket.dir: %q is on, inside or above %s, which the image ships or the container runtime mounts: the socket's emptyDir mounted there would hide what is there (Baton would not even start without its loader and libraries). Choose a folder of its own under /run, /var/run or /tmp (the default is /var/run/baton), or a new top-level folder such as /baton-socket" $v.socket.dir $m) -}}
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
{{- /* Monitors scrape the metrics port: asking for one without metrics is a contradiction the
chart would otherwise settle by rendering no monitor. */ -}}
{{- if not $v.metrics.enabled -}}
{{- range $m := list "podMonitor" "serviceMonitor" -}}
{{- if (get $v.metrics $m).enabled -}}
{{- fail (printf "metrics.%s.enabled needs metrics.enabled: a monitor scrapes Baton's metrics port, which metrics.enabled: false turns off (turn both on, or both off)" $m) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* Resources: a request above its limit is refused by Kubernetes when the pod is created. */ -}}
{{- $requests := $v.resources.requests | default dict -}}
{{- $limits := $v.resources.limits | default dict -}}
{{- range $name, $limit := $limits -}}
{{- if hasKey $requests $name -}}
{{- $req := get $requests $name -}}
{{- if gt (include "baton.quantity" $req | float64) (mulf (include "baton.quantity" $limit | float64) 1.000000001) -}}
{{- fail (printf "resources.requests.%s (%v) is more than resources.limits.%s (%v): Kubernetes refuses a request above its limit" $name $req $name $limit) -}}
{{- end -}}
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
{{- range $i, $rule := $v.rateLimit.rules -}}
{{- include "baton.checkDescriptors" (list (printf "rateLimit.rules[%d] (domain %q): descriptors" $i (toString $rule.domain)) ($rule.descriptors | default list)) -}}
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
{{- /* Flags the chart sets from its values in other configurations (the pod's ports, mounts,
probes and annotations follow those values, not extraArgs). */ -}}
{{- $governed := dict "--listen" "transport and tcp.port" "--socket" "transport and socket.dir, socket.name" "--socket-mode" "socket.mode" "--socket-group" "socket.group" "--health-listen" "health.address and health.port" "--redis-sentinel-master" "redis.mode and redis.sentinelMaster" "--redis-username" "redis.username" "--redis-password-file" "redis.password.existingSecret" "--redis-tls-ca" "redis.tls.existingSecret" "--redis-tls-cert" "redis.tls.clientCert" "--redis-tls-key" "redis.tls.clientCert" "--redis-tls-insecure" "redis.tls.insecure" "--tls-cert" "tls.existingSecret" "--tls-key" "tls.existingSecret" "--tls-client-ca" "tls.clientCA" "--api-token-file" "apiToken.existingSecret" "--ratelimit-config" "rateLimit.rules" "--ratelimit-config-reload" "rateLimit.rules and rateLimit.reloadInterval" "--metrics-listen" "metrics.enabled and metrics.port" -}}
{{- if hasKey $governed $flag -}}
{{- fail (printf "extraArgs: %s belongs to the chart's values (%s), which also set the pod's ports, mounts and probes to match: set those instead" $flag (get $governed $flag)) -}}
{{- end -}}
{{- /* The flag's kind: a switch takes no value, the others a value that is not empty. */ -}}
{{- if eq $flag "--redis-tls-insecure" -}}
{{- if contains "=" . -}}
{{- fail (printf "extraArgs: %s is a switch and takes no value (Baton refuses %q)" $flag .) -}}
{{- end -}}
{{- else if not (regexMatch "^--[a-z0-9-]+=." .) -}}
{{- fail (printf "extraArgs: %q gives %s no value: write it as one argument %s=VALUE (Baton refuses a flag without its value, and an empty one)" . $flag $flag) -}}
{{- end -}}
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

{{/* Baton's container security context. The hardening is not a value: whatever `securityContext`
holds (Helm deletes keys set to null before anything sees them), Baton runs as non-root with a
read-only root filesystem, no privilege escalation, no capabilities and a seccomp profile
(RuntimeDefault, or the Localhost profile the values name). The values choose only the user and
group IDs (non-zero; the image's 65532 when left out), a Localhost seccomp or AppArmor profile,
SELinux and Windows options; "baton.checkSecurityContext" refuses the rest. */}}
{{- define "baton.securityContext" -}}
{{- include "baton.checkSecurityContext" . -}}
{{- $sc := .baton.securityContext | default dict -}}
{{- $seccomp := $sc.seccompProfile | default dict -}}
runAsNonRoot: true
runAsUser: {{ int64 (default 65532 $sc.runAsUser) }}
runAsGroup: {{ int64 (default 65532 $sc.runAsGroup) }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  {{- if eq (toString $seccomp.type) "Localhost" }}
  type: Localhost
  localhostProfile: {{ $seccomp.localhostProfile | quote }}
  {{- else }}
  type: RuntimeDefault
  {{- end }}
{{- with $sc.appArmorProfile }}
appArmorProfile:
  {{- include "baton.toYaml" . | nindent 2 }}
{{- end }}
{{- with $sc.seLinuxOptions }}
seLinuxOptions:
  {{- include "baton.toYaml" . | nindent 2 }}
{{- end }}
{{- with $sc.windowsOptions }}
windowsOptions:
  {{- include "baton.toYaml" . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Fails the render on a `securityContext` that would weaken Baton's hardening, naming the key:
the template renders the hardening regardless, so these values would only be ignored. */}}
{{- define "baton.checkSecurityContext" -}}
{{- $sc := .baton.securityContext | default dict -}}
{{- $why := "Baton's container always runs non-root, with a read-only root filesystem, no privilege escalation, no capabilities and a RuntimeDefault or Localhost seccomp profile; the values choose only runAsUser and runAsGroup (non-zero), a Localhost seccompProfile or appArmorProfile, seLinuxOptions and windowsOptions" -}}
{{- if and (hasKey $sc "runAsNonRoot") (not (kindIs "invalid" $sc.runAsNonRoot)) (ne $sc.runAsNonRoot true) -}}
{{- fail (printf "securityContext.runAsNonRoot: must be true (or left out). %s" $why) -}}
{{- end -}}
{{- if and (hasKey $sc "readOnlyRootFilesystem") (not (kindIs "invalid" $sc.readOnlyRootFilesystem)) (ne $sc.readOnlyRootFilesystem true) -}}
{{- fail (printf "securityContext.readOnlyRootFilesystem: must be true (or left out): Baton writes only to its socket's folder. %s" $why) -}}
{{- end -}}
{{- if and (hasKey $sc "allowPrivilegeEscalation") (not (kindIs "invalid" $sc.allowPrivilegeEscalation)) (ne $sc.allowPrivilegeEscalation false) -}}
{{- fail (printf "securityContext.allowPrivilegeEscalation: must be false (or left out). %s" $why) -}}
{{- end -}}
{{- if and (hasKey $sc "privileged") (not (kindIs "invalid" $sc.privileged)) (ne $sc.privileged false) -}}
{{- fail (printf "securityContext.privileged: must be false (or left out). %s" $why) -}}
{{- end -}}
{{- range $id := list "runAsUser" "runAsGroup" -}}
{{- if and (hasKey $sc $id) (not (kindIs "invalid" (get $sc $id))) (eq (float64 (get $sc $id)) 0.0) -}}
{{- fail (printf "securityContext.%s: 0 is root's: give a non-zero ID (or leave it out for the image's 65532). %s" $id $why) -}}
{{- end -}}
{{- end -}}
{{- with $sc.capabilities -}}
{{- if .add -}}
{{- fail (printf "securityContext.capabilities.add: %v: Baton needs no capability and gets none. %s" .add $why) -}}
{{- end -}}
{{- if and (hasKey . "drop") (not (has "ALL" (.drop | default list))) -}}
{{- fail (printf "securityContext.capabilities.drop: must be [ALL] (or left out), not %v. %s" .drop $why) -}}
{{- end -}}
{{- end -}}
{{- range $p := list "seccompProfile" "appArmorProfile" -}}
{{- with (get $sc $p) -}}
{{- if not (has (toString .type) (list "RuntimeDefault" "Localhost")) -}}
{{- fail (printf "securityContext.%s.type: %s is refused: give RuntimeDefault, or Localhost with a localhostProfile. %s" $p (toString .type) $why) -}}
{{- end -}}
{{- if and (eq .type "Localhost") (not .localhostProfile) -}}
{{- fail (printf "securityContext.%s: type Localhost needs a localhostProfile (the profile's path on the node). %s" $p $why) -}}
{{- end -}}
{{- if and (eq .type "RuntimeDefault") .localhostProfile -}}
{{- fail (printf "securityContext.%s: a localhostProfile goes with type Localhost only (Kubernetes refuses it with RuntimeDefault)" $p) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq (toString $sc.procMount) "Unmasked" -}}
{{- fail (printf "securityContext.procMount: Unmasked is refused (it exposes the host's /proc paths). %s" $why) -}}
{{- end -}}
{{- with $sc.windowsOptions -}}
{{- if .hostProcess -}}
{{- fail (printf "securityContext.windowsOptions.hostProcess: true is refused (a host process has the node's privileges). %s" $why) -}}
{{- end -}}
{{- end -}}
{{- end -}}
