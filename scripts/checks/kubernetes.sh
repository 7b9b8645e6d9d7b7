#!/usr/bin/env bash
# Checks deploy/kubernetes/ offline: renders the kustomization (with and without the optional
# priority-class component) with `kubectl kustomize` when kubectl is installed, else takes each
# listed file as it is; validates every object with kubernetes-validate (strict) against
# Kubernetes $K8S_VERSION (PodMonitor, a Prometheus Operator CRD, has no schema there and is
# checked structurally by the posture script instead); lints with yamllint (.yamllint); and
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

# 1. Render.
renders=()
kubectl=${KUBECTL-$(command -v kubectl || true)}
if [ -n "$kubectl" ] && "$kubectl" kustomize --help >/dev/null 2>&1; then
  how="kubectl kustomize"
  "$kubectl" kustomize "$dir" >"$work/base.yaml" 2>>"$log" || fail "kubectl kustomize deploy/kubernetes"
  # The optional component, applied to a copy (kustomize refuses absolute paths).
  cp -r "$dir" "$work/base" && mkdir "$work/overlay"
  printf 'resources: [../base]\ncomponents: [../base/components/priority-class]\n' >"$work/overlay/kustomization.yaml"
  "$kubectl" kustomize "$work/overlay" >"$work/with-priority.yaml" 2>>"$log" \
    || fail "kubectl kustomize with components/priority-class"
  grep -q 'priorityClassName: sysscope-node-agent' "$work/with-priority.yaml" \
    || fail "components/priority-class does not set priorityClassName"
  renders=("$work/base.yaml" "$work/with-priority.yaml")
  posture=("$work/base.yaml")
else
  how="files as listed (kubectl not installed)"
  renders=("$dir"/*.yaml "$dir"/components/*/priorityclass.yaml)
  posture=(--kustomization "$dir")
fi

# 2. Schemas. A missing schema is only acceptable for the Prometheus Operator's kinds.
objects=0
for f in "${renders[@]}"; do
  [ "$(basename "$f")" = kustomization.yaml ] && continue
  out=$(kubernetes-validate --strict -k "$K8S_VERSION" "$f" 2>&1)
  rc=$?
  echo "$out" >>"$log"
  [ $rc -eq 0 ] || fail "kubernetes-validate $(basename "$f") against $K8S_VERSION"
  if echo "$out" | grep "Couldn't find schema" | grep -v 'monitoring.coreos.com/' | grep -q .; then
    fail "an object of unknown kind in $(basename "$f")"
  fi
  objects=$((objects + $(echo "$out" | grep -c ' passed for resource ')))
done

# 3. Lint the hand-written YAML.
yamllint --strict -c "$top/.yamllint" "$dir" >>"$log" 2>&1 || fail "yamllint"

# 4. Security posture (and a self-test that every check can fail).
python3 "$top/scripts/checks/k8s_security_posture.py" "${posture[@]}" --self-test \
  --docs "$top/docs/kubernetes.md" >>"$log" 2>&1 || fail "security posture: $(tail -n 1 "$log")"

[ "${VERBOSE:-0}" = 1 ] && cat "$log"
echo "kubernetes: PASS (rendered with $how; $objects objects valid against Kubernetes $K8S_VERSION; yamllint clean; $(tail -n 1 "$log" | sed 's/^OK: //'))"
