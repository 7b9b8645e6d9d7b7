#!/usr/bin/env bash
# Checks deploy/kubernetes/ offline: renders every variant (the plain kustomization, with the
# optional priority-class component, the two GPU overlays of deploy/kubernetes-gpu/, a GPU
# overlay with the optional components listed after it, before it, and enabled in
# deploy/kubernetes itself, each of which must reach both DaemonSets, and the prometheus-rule
# and no-network-policy components, and kube-prometheus-stack on the base and a GPU overlay) with
# `kubectl kustomize` when kubectl is installed, else
# with the posture script's own renderer (the subset of kustomize these use);
# checks what each variant must carry (k8s_variants.py: the PodMonitor's protobuf-first
# scrape protocols, the kube-prometheus-stack `release` label on the PodMonitor and the rules,
# no password in any DaemonSet's probes, env or args, web-auth's Secret-backed PodMonitor, a
# PriorityClass on every GPU variant, the operator's wait for the toolkit, and each
# host-driver variant's NVML path);
# checks that the PrometheusRule is the rules file (prometheusrule.py) and that the PodMonitor
# and the Grafana data source assume one scrape interval; validates every object
# with kubernetes-validate (strict) against Kubernetes $K8S_VERSION (PodMonitor and
# PrometheusRule, Prometheus Operator CRDs, have no schema there: the posture script checks the
# PodMonitor, prometheusrule.py the rules); lints with yamllint (.yamllint); and
# asserts the security posture (k8s_security_posture.py, which also proves with a self-test
# that each of its checks can fail). Prints one result line (VERBOSE=1 prints the details);
# exits non-zero on failure. KUBECTL= (empty) forces the path without kubectl.
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir="$top/deploy/kubernetes"
K8S_VERSION=${K8S_VERSION:-1.37.0}
work=$(mktemp -d)
log="$work/log"
trap 'rm -rf "$work"' EXIT
fail() {
  cat "$log" >&2
  echo "kubernetes: FAIL ($1)"
  exit 1
}

for tool in kubernetes-validate yamllint python3; do
  command -v "$tool" >/dev/null || fail "$tool not found; run scripts/setup.sh --test"
done

# 1. Render. Each variant: a name and a kustomization directory (an overlay made here when
# needed: kustomize refuses absolute paths and parents of the kustomization, so the overlay
# sits next to copies of deploy/kubernetes and deploy/kubernetes-gpu).
cp -r "$dir" "$work/kubernetes" && cp -r "$top/deploy/kubernetes-gpu" "$work/kubernetes-gpu"
mkdir "$work/with-priority" "$work/gpu-after" "$work/gpu-before" "$work/in-base" "$work/rules-no-netpol" \
  "$work/kps" "$work/gpu-kps"
printf 'resources: [../kubernetes]\ncomponents: [../kubernetes/components/kube-prometheus-stack]\n' \
  >"$work/kps/kustomization.yaml"
printf 'resources: [../kubernetes-gpu/operator]\ncomponents: [../kubernetes/components/kube-prometheus-stack]\n' \
  >"$work/gpu-kps/kustomization.yaml"
printf 'resources: [../kubernetes]\ncomponents: [../kubernetes/components/priority-class]\n' \
  >"$work/with-priority/kustomization.yaml"
printf 'resources: [../kubernetes]\ncomponents:\n  - ../kubernetes/components/prometheus-rule\n  - ../kubernetes/components/no-network-policy\n' \
  >"$work/rules-no-netpol/kustomization.yaml"
printf 'resources: [../kubernetes]\ncomponents:\n  - ../kubernetes/components/gpu-operator\n  - ../kubernetes/components/priority-class\n  - ../kubernetes/components/web-auth\n' \
  >"$work/gpu-after/kustomization.yaml"
printf 'resources: [../kubernetes]\ncomponents:\n  - ../kubernetes/components/priority-class\n  - ../kubernetes/components/web-auth\n  - ../kubernetes/components/gpu-host-driver\n' \
  >"$work/gpu-before/kustomization.yaml"
# The optional components enabled in deploy/kubernetes/kustomization.yaml, then a GPU overlay.
cp -r "$dir" "$work/in-base/kubernetes" && cp -r "$top/deploy/kubernetes-gpu" "$work/in-base/kubernetes-gpu"
# (The GPU overlays bring priority-class themselves: web-auth only, here.)
printf 'components:\n  - components/web-auth\n' >>"$work/in-base/kubernetes/kustomization.yaml"
variants=(base:kubernetes with-priority:with-priority gpu-operator:kubernetes-gpu/operator
  gpu-host-driver:kubernetes-gpu/host-driver gpu-host-driver-lib64:kubernetes-gpu/host-driver-lib64
  gpu-host-driver-arm64:kubernetes-gpu/host-driver-arm64 gpu-components-after:gpu-after
  gpu-components-before:gpu-before gpu-components-in-base:in-base/kubernetes-gpu/operator
  rules-no-network-policy:rules-no-netpol kube-prometheus-stack:kps gpu-kube-prometheus-stack:gpu-kps)
# What each variant must carry besides the posture (k8s_variants.py; the first of each kind
# also proves with a self-test that its checks can fail).
declare -A expect=(
  [base]=scrape,no-release,no-credential,lean [with-priority]=scrape,no-release,no-credential,priority
  [gpu-operator]=scrape,no-release,no-credential,priority,toolkit-wait
  [gpu-host-driver]=scrape,no-release,no-credential,priority,nvml-debian-amd64
  [gpu-host-driver-lib64]=scrape,no-release,no-credential,priority,nvml-lib64
  [gpu-host-driver-arm64]=scrape,no-release,no-credential,priority,nvml-debian-arm64
  [gpu-components-after]=scrape,no-credential,web-auth,priority,toolkit-wait
  [gpu-components-before]=scrape,no-credential,web-auth,priority,nvml-debian-amd64
  [gpu-components-in-base]=scrape,no-credential,web-auth,priority,toolkit-wait
  [rules-no-network-policy]=scrape,no-release,no-credential
  [kube-prometheus-stack]=scrape,release,no-credential
  [gpu-kube-prometheus-stack]=scrape,release,no-credential,priority,toolkit-wait
)
kubectl=${KUBECTL-$(command -v kubectl || true)}
if [ -n "$kubectl" ] && "$kubectl" kustomize --help >/dev/null 2>&1; then
  how="kubectl kustomize"
  render() { "$kubectl" kustomize "$1"; }
else
  how="the posture script's renderer (kubectl not installed)"
  render() {
    python3 - "$1" "$top/scripts/checks" <<'PY'
import sys, yaml
sys.path.insert(0, sys.argv[2])
import k8s_security_posture as k
print(yaml.safe_dump_all(k.render_kustomization(sys.argv[1]), sort_keys=False))
PY
  }
fi
renders=()
for v in "${variants[@]}"; do
  name=${v%%:*}
  render "$work/${v#*:}" >"$work/$name.yaml" 2>>"$log" || fail "rendering the $name variant"
  renders+=("$work/$name.yaml")
done
# What each optional piece must have done.
grep -q 'priorityClassName: sysscope-node-agent' "$work/with-priority.yaml" \
  || fail "components/priority-class does not set priorityClassName"
grep -q 'runtimeClassName: nvidia' "$work/gpu-operator.yaml" \
  || fail "components/gpu-operator does not set runtimeClassName"
for v in gpu-components-after gpu-components-before gpu-components-in-base; do
  [ "$(grep -c 'priorityClassName: sysscope-node-agent' "$work/$v.yaml")" = 2 ] \
    && [ "$(grep -c -- '--web.config.file=' "$work/$v.yaml")" = 2 ] \
    || fail "$v: priority-class and web-auth must reach both DaemonSets, whatever the order of components"
done
grep -q '^kind: PrometheusRule' "$work/rules-no-network-policy.yaml" \
  || fail "components/prometheus-rule adds no PrometheusRule"
grep -q '^kind: NetworkPolicy' "$work/rules-no-network-policy.yaml" \
  && fail "components/no-network-policy leaves the NetworkPolicy"
grep -q '^kind: NetworkPolicy' "$work/base.yaml" || fail "the base has no NetworkPolicy"
variant_checks=0
for v in "${variants[@]}"; do
  name=${v%%:*}
  case $name in base | kube-prometheus-stack | gpu-components-after | gpu-host-driver*) self_test=--self-test ;;
    *) self_test= ;;
  esac
  python3 "$top/scripts/checks/k8s_variants.py" "$work/$name.yaml" --expect "${expect[$name]}" \
    $self_test >>"$log" 2>&1 || fail "the $name variant: $(tail -n 1 "$log")"
  variant_checks=$((variant_checks + $(echo "${expect[$name]}" | tr ',' '\n' | wc -l)))
done
# The PrometheusRule is the rules file, as scripts/checks/prometheusrule.py --write makes it.
python3 "$top/scripts/checks/prometheusrule.py" >>"$log" 2>&1 \
  || fail "$(tail -n 1 "$log")"
rule_check=$(tail -n 1 "$log" | sed 's/^OK: //')
# One scrape interval everywhere (docs/kubernetes.md, "Scrape interval"): the PodMonitor's and
# the Grafana data source's.
scrape=$(sed -n 's/^ *interval: *//p' "$dir/podmonitor.yaml")
grafana=$(sed -n 's/^ *timeInterval: *//p' "$top/grafana/provisioning/datasources/prometheus.yaml")
[ -n "$scrape" ] && [ "$scrape" = "$grafana" ] \
  || fail "the PodMonitor scrapes every '$scrape' but the Grafana data source assumes '$grafana'"
posture=("${renders[@]}")

# 2. Schemas, every variant in one run. A missing schema is only acceptable for the Prometheus
# Operator's kinds.
out=$(kubernetes-validate --strict -k "$K8S_VERSION" "${renders[@]}" 2>&1)
rc=$?
echo "$out" >>"$log"
[ $rc -eq 0 ] || fail "kubernetes-validate against $K8S_VERSION: $(echo "$out" | grep -v -e ' passed for resource ' -e "Couldn't find schema" | head -n 1)"
if echo "$out" | grep "Couldn't find schema" | grep -v 'monitoring.coreos.com/' | grep -q .; then
  fail "an object of unknown kind: $(echo "$out" | grep "Couldn't find schema" | grep -v 'monitoring.coreos.com/' | head -n 1)"
fi
objects=$(echo "$out" | grep -c ' passed for resource ')

# 3. Lint the hand-written YAML.
yamllint --strict -c "$top/.yamllint" "$dir" "$top/deploy/kubernetes-gpu" >>"$log" 2>&1 || fail "yamllint"

# 4. Security posture of every variant, with a self-test that every check can fail on the
# plain one and the two GPU overlays (the others differ only in what the components add).
for f in "${posture[@]}"; do
  case $(basename "$f" .yaml) in
    base | gpu-operator | gpu-host-driver*) self_test=--self-test ;;
    *) self_test= ;;
  esac
  python3 "$top/scripts/checks/k8s_security_posture.py" "$f" $self_test \
    --docs "$top/docs/kubernetes.md" >>"$log" 2>&1 \
    || fail "security posture of the $(basename "$f" .yaml) variant: $(tail -n 1 "$log")"
done

[ "${VERBOSE:-0}" = 1 ] && cat "$log"
echo "kubernetes: PASS (${#variants[@]} variants rendered with $how; $objects objects valid against Kubernetes $K8S_VERSION; yamllint clean; $variant_checks variant checks (k8s_variants.py); $rule_check; one scrape interval ($scrape); $(grep 'mutations all caught' "$log" | tail -n 1 | sed 's/^OK: //'))"
