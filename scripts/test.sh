#!/usr/bin/env bash
# Runs the whole test suite: set-up (idempotent), formatting and lints, the unit tests and the
# real-kernel integration tests (as root; without root they skip, and under CI=true they
# fail), then every check in scripts/checks/ (rules, dashboards, manifests, ...).
# Ends with the time each step took and one line: "tests: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
suite_started=$SECONDS
scripts/setup.sh --test || { echo "tests: 0 passed, 1 failed"; exit 1; }
timings=("setup $((SECONDS - suite_started))s")
export PATH="$HOME/.cargo/bin:$PATH"

passed=0
failed=0
failures=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT

step() {
  local name=$1 started=$SECONDS
  shift
  printf '\n==> %s\n' "$name"
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("$name")
  fi
  timings+=("$name $((SECONDS - started))s")
}

step "cargo fmt" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --locked --all-targets -- -D warnings
# The probes build for the BPF target with nightly (as exporter/build.rs builds them): every
# `unsafe` block there says why it is sound too.
step "clippy (probes)" bash -c 'cd ebpf/probes && cargo +nightly clippy --locked --quiet \
  --target bpfel-unknown-none -Z build-std=core --release --target-dir ../../target/probes-clippy \
  -- -A clippy::all -D clippy::undocumented_unsafe_blocks'

printf '\n==> cargo test\n'
test_started=$SECONDS
cargo test --locked --no-fail-fast 2>&1 | tee "$log"
test_rc=${PIPESTATUS[0]}
# Count individual tests from cargo's per-binary summaries.
read -r t_pass t_fail < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } } END { print p+0, f+0 }' "$log")
passed=$((passed + t_pass))
failed=$((failed + t_fail))
if [ "$test_rc" -ne 0 ] && [ "$t_fail" -eq 0 ]; then
  failed=$((failed + 1))
  failures+=("cargo test (did not complete)")
elif [ "$t_fail" -ne 0 ]; then
  failures+=("cargo test")
fi
timings+=("cargo test $((SECONDS - test_started))s")

for check in scripts/checks/*.sh; do
  [ -e "$check" ] || continue
  step "$(basename "$check" .sh)" bash "$check"
done

echo
echo "time per step: $(printf '%s, ' "${timings[@]}" | sed 's/, $//'); $((SECONDS - suite_started))s in all"
if [ "$failed" -ne 0 ]; then
  echo "failed: ${failures[*]}"
fi
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
