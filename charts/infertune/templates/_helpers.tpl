{{- /* The operator's pods: the Deployment's selector and template, the webhook Service's
selector and the PodMonitor's select them by these. */}}
{{- define "infertune.operatorSelector" -}}
app.kubernetes.io/name: infertune
app.kubernetes.io/component: operator
{{- end -}}

{{- define "infertune.labels" -}}
app.kubernetes.io/name: infertune
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- /* Fails naming `field` and the key when a key of `keys` is no label key (`annotations`:
no annotation key, which the API server checks in lower case). Here, not in the
schema: Helm names the wrong field for a propertyNames failure. */}}
{{- define "infertune.checkKeys" -}}
{{- $kind := ternary "an annotation" "a label" .annotations -}}
{{- range $key, $_ := .keys -}}
{{- $prefix := ternary (splitList "/" $key | first) "" (contains "/" $key) -}}
{{- $short := splitList "/" $key | last -}}
{{- $checked := ternary (lower $key) $key $.annotations -}}
{{- if or (not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" $checked)) (gt (len $prefix) 253) (gt (len $short) 63) -}}
{{- fail (printf "%s: %q is not %s key (an optional DNS subdomain prefix and /, then up to 63 letters, digits, -, _ or ., starting and ending with a letter or digit)" $.field $key $kind) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "infertune.image" -}}
{{- /* digest and imagePullSecrets are new: absent from values reused from an older chart. */ -}}
{{- $digest := .Values.image.digest | default "" -}}
{{- $tag := .Values.image.tag | default (ternary "" .Chart.AppVersion (ne $digest "")) -}}
{{ .Values.image.repository }}{{ with $tag }}:{{ . }}{{ end }}{{ with $digest }}@{{ . }}{{ end }}
{{- end -}}

{{/* The --prometheus-* access options from .Values.prometheus, one per line. */}}
{{- define "infertune.prometheusAccessArgs" -}}
{{- $p := .Values.prometheus -}}
{{- $access := or $p.caConfigMap.name $p.clientCertSecret $p.credentialsSecret.name $p.credentialsFile $p.headers -}}
{{- if and $access (not $p.url) -}}
{{- fail "prometheus.caConfigMap, clientCertSecret, credentialsSecret, credentialsFile and headers need prometheus.url: without it nothing is queried" -}}
{{- end -}}
{{- if and $p.credentialsSecret.name $p.credentialsFile -}}
{{- fail "prometheus.credentialsSecret and prometheus.credentialsFile both give the credentials; set one" -}}
{{- end -}}
{{- if and (or $p.caConfigMap.name $p.clientCertSecret) (not (hasPrefix "https://" $p.url)) -}}
{{- fail "prometheus.caConfigMap and prometheus.clientCertSecret are for an https:// prometheus.url; use https:// or drop them" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $name, $value := $p.headers -}}
{{- /* Here, not in the schema: Helm names the wrong field for a propertyNames failure. */}}
{{- if not (regexMatch "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$" $name) -}}
{{- fail (printf "prometheus.headers: %q is not an HTTP header name (letters, digits and !#$%%&'*+.^_`|~-, no spaces)" $name) -}}
{{- end -}}
{{- $key := lower $name -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "prometheus.headers: %s is given twice (header names are case-insensitive); keep one" $name) -}}
{{- end -}}
{{- $_ := set $seen $key true -}}
{{- /* Headers become arguments, which the Deployment and every process list show. */}}
{{- if has $key (list "authorization" "proxy-authorization") -}}
{{- fail (printf "prometheus.headers: %s carries credentials, which would be written into the Deployment's arguments; use prometheus.credentialsSecret (or credentialsFile), mounted as a file and sent as Authorization" $name) -}}
{{- end -}}
{{- end -}}
{{- if $p.caConfigMap.name }}
- --prometheus-ca-file=/etc/infertune/prometheus-ca/ca.crt
{{- end }}
{{- if $p.clientCertSecret }}
- --prometheus-cert-file=/etc/infertune/prometheus-client/tls.crt
- --prometheus-key-file=/etc/infertune/prometheus-client/tls.key
{{- end }}
{{- if $p.credentialsSecret.name }}
- --prometheus-credentials-file=/etc/infertune/prometheus-credentials/credentials
{{- else if $p.credentialsFile }}
- {{ printf "--prometheus-credentials-file=%s" $p.credentialsFile | quote }}
{{- end }}
{{- if and (or $p.credentialsSecret.name $p.credentialsFile) $p.authType }}
- {{ printf "--prometheus-auth-type=%s" $p.authType | quote }}
{{- end }}
{{- range $name, $value := $p.headers }}
- {{ printf "--prometheus-header=%s: %s" $name $value | quote }}
{{- end }}
{{- end -}}

{{/* .Values.extraArgs, one per line. Not an option the chart sets: given again, argparse
keeps the last one (or refuses --namespace beside --all-namespaces), and the container's port,
its probes, its mounts or its Roles no longer match what the operator does. An abbreviation
(argparse takes --webhook-p for --webhook-port) counts as the option. */}}
{{- define "infertune.extraArgs" -}}
{{- $chartSets := dict
  "namespace" "watchNamespaces" "all-namespaces" "watchNamespaces"
  "liveness" "ipFamily" "webhook-addr" "ipFamily" "webhook-port" "webhook.port"
  "webhook-cert" "webhook.certSecret" "webhook-key" "webhook.certSecret"
  "webhook-ca" "webhook.certSecret" "launcher-image" "image" "retune-interval" "retuneInterval"
  "prometheus-url" "prometheus.url" "no-promql-templates" "prometheus.templates"
  "prometheus-ca-file" "prometheus.caConfigMap" "prometheus-cert-file" "prometheus.clientCertSecret"
  "prometheus-key-file" "prometheus.clientCertSecret"
  "prometheus-credentials-file" "prometheus.credentialsSecret (or credentialsFile)"
  "prometheus-auth-type" "prometheus.authType" "prometheus-header" "prometheus.headers"
  "webhook-service" "" "webhook-owner" "" "webhook-host" "" "operator-namespace" ""
  "ready-file" "" "no-mig" "mig.enabled" "mig-drain-other-namespaces" "mig.drainOtherNamespaces"
  "leader-elect" "" "leader-elect-lease" ""
  "standalone" "" "metrics-port" "metrics.port (and metrics.enabled)" "metrics-addr" "ipFamily" -}}
{{- /* The options of infertune run the chart leaves to extraArgs (tests/test_chart_options.py
keeps both lists equal to the command's): another one ended the operator at start, in a crash
loop, and `helm upgrade --wait` waited out its timeout. */ -}}
{{- $userSets := list "crd-check-interval" "kubeconfig" "mig-config-delay"
  "no-static-cpu-manager" "verbose" "webhook-check-interval" -}}
{{- /* Of those, the flags: argparse ends the operator on `--verbose=true` ("ignored explicit
argument"), and on an option that takes a value given without one. */ -}}
{{- $flags := list "no-static-cpu-manager" "verbose" -}}
{{- range $arg := .Values.extraArgs -}}
{{- $name := trimPrefix "--" $arg | regexFind "^[^=]*" -}}
{{- $matches := list -}}
{{- range $option := concat (keys $chartSets) $userSets -}}
{{- if hasPrefix $name $option -}}{{- $matches = append $matches $option -}}{{- end -}}
{{- end -}}
{{- if not $matches -}}
{{- fail (printf "extraArgs: %s is not an option of infertune run; the ones left to extraArgs are --%s" $arg (join ", --" $userSets)) -}}
{{- end -}}
{{- /* argparse takes an abbreviation only when one option begins with it: --mig was read
as --mig-config-delay here, where the operator stopped at start on it. */ -}}
{{- if and (gt (len $matches) 1) (not (has $name $matches)) -}}
{{- fail (printf "extraArgs: %s is ambiguous: --%s begin with it, and infertune run stops at start on it; write the option in full" $arg (join ", --" (sortAlpha $matches))) -}}
{{- end -}}
{{- range $option := $userSets -}}
{{- if hasPrefix $name $option -}}
{{- if and (has $option $flags) (contains "=" $arg) -}}
{{- fail (printf "extraArgs: %s: --%s takes no value; give it alone" $arg $option) -}}
{{- else if and (not (has $option $flags)) (not (contains "=" $arg)) -}}
{{- fail (printf "extraArgs: %s: --%s takes a value, in the same item: --%s=VALUE" $arg $option $option) -}}
{{- end -}}
{{- /* What argparse refuses at start, refused here: the operator crash-looped on it. */ -}}
{{- $value := regexReplaceAll "^[^=]*=" $arg "" -}}
{{- if and (not (has $option $flags)) (eq $value "") -}}
{{- fail (printf "extraArgs: %s: --%s is given no value; give one, or leave the option out" $arg $option) -}}
{{- end -}}
{{- if and (eq $option "mig-config-delay") (eq (include "infertune.migEnabled" $) "false") -}}
{{- fail (printf "extraArgs: %s: --mig-config-delay has no effect with mig.enabled=false (MIG partitioning off), and the operator stops at start on it; leave it out, or turn MIG on" $arg) -}}
{{- end -}}
{{- if has $option (list "crd-check-interval" "mig-config-delay" "webhook-check-interval") -}}
{{- if not (regexMatch "^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?$" $value) -}}
{{- fail (printf "extraArgs: %s: --%s takes a number of seconds, such as 60 (no unit)" $arg $option) -}}
{{- end -}}
{{- $seconds := float64 $value -}}
{{- if or (gt $seconds 86400.0) (and (eq $seconds 0.0) (ne $option "mig-config-delay")) -}}
{{- fail (printf "extraArgs: %s: --%s takes seconds %s, at most 86400 (a day)" $arg $option (ternary "from 0" "above 0" (eq $option "mig-config-delay"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $option, $value := $chartSets -}}
{{- if hasPrefix $name $option -}}
{{- if $value -}}
{{- fail (printf "extraArgs: %s sets --%s, which the chart sets from %s; set that value instead" $arg $option $value) -}}
{{- else -}}
{{- fail (printf "extraArgs: %s sets --%s, which the chart sets itself (its webhook Service and ClusterRole, the release namespace); leave it out" $arg $option) -}}
{{- end -}}
{{- end -}}
{{- end }}
- {{ $arg | quote }}
{{- end -}}
{{- end -}}

{{/* "true" unless mig.enabled is false; values reused from a chart before mig.enabled have
none: MIG stays on, as it was. */}}
{{- define "infertune.migEnabled" -}}
{{- $mig := .Values.mig | default dict -}}
{{- if and (hasKey $mig "enabled") (not $mig.enabled) -}}false{{- else -}}true{{- end -}}
{{- end -}}
