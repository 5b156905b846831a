#!/usr/bin/env bash
# The project's whole test suite, in three parts, each run even when an earlier one failed:
#  1. native-vmm: `cargo test` of the unit tests and the integration tests that need no vCPU;
#  2. TypeScript: vitest, against a real PostgreSQL server and embedded PGlite;
#  3. the KVM tier (scripts/kvm-tier.sh): the program tests (native-vmm/tests/*_ptrace.rs,
#     *_kvm.rs) and the gateway's end-to-end execution on KVM, natively on a /dev/kvm that can
#     create a VM, else inside a QEMU guest.
# Ends with one line of the counts of all three: "total: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-debian.sh || exit 1

started_pg=0
if [ -z "${TEST_DATABASE_URL:-}" ]; then
  pg_env=$(bash scripts/postgres.sh start) || exit 1
  eval "$pg_env"
  started_pg=1
fi
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/sandfork-test.XXXXXX")
cleanup() {
  if [ "$started_pg" = 1 ]; then bash scripts/postgres.sh stop; fi
  rm -rf "$LOGS"
}
trap cleanup EXIT

# suite NAME CMD...: runs CMD, shows and keeps its output, records its exit code.
declare -A rcs
suite() {
  local name=$1
  shift
  "$@" 2>&1 | tee "$LOGS/$name.log"
  rcs[$name]=${PIPESTATUS[0]}
}

# The program tests need a vCPU: the KVM tier runs them, so this part leaves them out, and the
# long suites that have a command of their own (cpython_suites: `npm run test:cpython`).
cargo_targets=(--lib --bins)
for f in native-vmm/tests/*.rs; do
  case $f in *_ptrace.rs | *_kvm.rs | */cpython_suites.rs) ;; *) cargo_targets+=(--test "$(basename "$f" .rs)") ;; esac
done
echo "== native-vmm: cargo test ${cargo_targets[*]}"
suite cargo bash -c 'cd native-vmm && cargo test --release "$@"' - "${cargo_targets[@]}"

echo "== TypeScript: vitest (PostgreSQL at $TEST_DATABASE_URL, and PGlite)"
# One empty migrated PGlite database that the test files' fresh ones are copied from
# (db/testing/pglite-seed.ts): ~4 s of initdb each otherwise. Without it they make their own.
if node_modules/.bin/tsx db/testing/pglite-seed.ts "$LOGS/pglite-seed" > "$LOGS/pglite-seed.log" 2>&1; then
  export SANDFORK_TEST_PGLITE_SEED=$LOGS/pglite-seed
else
  echo "test.sh: making the PGlite seed failed, each test makes its own database: $(tail -3 "$LOGS/pglite-seed.log")" >&2
fi
suite vitest npm run --silent test:ts

echo "== KVM tier"
suite kvm bash scripts/kvm-tier.sh

# ---- counts -----------------------------------------------------------------------------------
# cargo: the sum of its "test result: ok. N passed; M failed; ..." lines.
read -r cargo_passed cargo_failed < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed;.*/\1 \2/p' "$LOGS/cargo.log" \
  | awk '{p += $1; f += $2} END {print p + 0, f + 0}')
# vitest and the KVM tier end with "<name>: N passed, N failed[, N skipped]".
plain() { sed 's/\x1b\[[0-9;]*m//g' "$LOGS/$1.log" | grep -E "^$2: [0-9]+ passed, [0-9]+ failed" | tail -1 | sed -E 's/^[^:]*: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/'; }
read -r vitest_passed vitest_failed < <(plain vitest vitest; echo)
read -r kvm_passed kvm_failed < <(plain kvm kvm-tier; echo)

status=0
for name in cargo vitest kvm; do
  p=${name}_passed f=${name}_failed
  if [ -z "${!p:-}" ]; then printf -v "$p" 0; printf -v "$f" 1; fi
  # A suite that failed without counting a failure (a build error, a crash) counts one.
  if [ "${rcs[$name]}" != 0 ] && [ "${!f}" = 0 ]; then printf -v "$f" 1; fi
  [ "${!f}" = 0 ] || status=1
done
echo "test.sh: cargo $cargo_passed passed, $cargo_failed failed; vitest $vitest_passed passed, $vitest_failed failed; KVM tier $kvm_passed passed, $kvm_failed failed"
echo "total: $((cargo_passed + vitest_passed + kvm_passed)) passed, $((cargo_failed + vitest_failed + kvm_failed)) failed"
exit $status
