#!/usr/bin/env bash
# The KVM test tier: every program test (native-vmm/tests/*_ptrace.rs and *_kvm.rs: Python and
# its stdlib, the C programs, the limits, the agent, snapshots and forks, the pool, the daemon,
# the vCPU state) on the product's KVM vCPU (SANDFORK_TEST_CPU=kvm), and the TypeScript tests
# that run guests (*.kvm.test.ts with vitest.kvm.config.ts: print(6*7) through the gateway and
# the real daemon on PGlite, billed; exactly-once billing under SIGKILL, on PGlite and
# PostgreSQL; the soak, and the soak beside a CPU hog on every core: soak-loaded.kvm.test.ts,
# 200 mixed requests, each with its own status, billing reconciled). scripts/test.sh runs it
# after the other suites, on every machine:
#
# - natively, where /dev/kvm opens and can create a VM with a vCPU (scripts/kvm-probe.sh);
# - otherwise inside QEMU guests with an emulated AMD SVM CPU (scripts/kvm-in-qemu.sh), one a
#   host core, each booted once and taking suites from a shared queue, longest first.
#
# A /dev/kvm that creates VMs but on which sandfork-vmm cannot run a static C program is not a
# reason to fall back: the tier says so and runs natively, and what fails there is the VMM's.
#
#   bash scripts/kvm-tier.sh          (npm run test:kvm)
#
# environment:
#   SANDFORK_KVM_TIER=auto|native|qemu   the path (default auto, as above); native fails where
#                                        /dev/kvm cannot create a VM
#   SANDFORK_KVM_TIER_QEMU_SCALE=N       SANDFORK_TEST_TIME_SCALE in QEMU (default 15: TCG runs
#                                        guest code ~13x slower than native); natively it is 1
#   SANDFORK_KVM_TIER_QEMU_GUESTS=N      how many QEMU guests of one vCPU share the suites
#                                        (default the host's cores, as many as have 7 GiB free)
#   SANDFORK_KVM_TIER_QEMU_TIMEOUT=SECS  each QEMU guest's wall-clock limit (default 3900; a
#                                        guest runs the suites ~8x slower than native)
#   SANDFORK_KVM_TIER_TESTS="a b"        only these suites: test file names (e.g. python_ptrace)
#                                        and/or TypeScript ones: vitest-kvm (all of them)
#                                        or vitest-kvm-NAME (NAME.kvm.test.ts) (default: all)
#
# It prints one line saying which path ran ("KVM tier: native /dev/kvm (kvm_pvm)" or "KVM tier:
# QEMU TCG, nested SVM, kernel 6.1.192"), each suite's counts, and ends with
# "kvm-tier: N passed, N failed". Exit code 0 only when tests ran and none failed.
#
# Internally, `kvm-tier.sh --run-here RESULTS_DIR LIST [QUEUE_DIR]` runs the suites of LIST
# (lines "name<TAB>test executable", and "vitest-kvm-NAME<TAB>its *.kvm.test.ts") where it is
# (host or guest), with QUEUE_DIR only those it claims there first, and appends each suite's
# counts to RESULTS_DIR/counts.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# ---- inside the chosen environment: run the suites, record counts ---------------------------

# run_suite RESULTS NAME EXE SHOW: runs one suite (a cargo test executable, or for
# vitest-kvm-NAME the *.kvm.test.ts file EXE) and appends its counts to RESULTS/counts.
# SHOW=live streams its output as it runs; SHOW=after prints it when it ends.
run_suite() {
  local results=$1 name=$2 exe=$3 show=$4 log rc line passed failed ignored started=$SECONDS
  log=$results/$name.log
  local out=/dev/stdout
  [ "$show" = live ] || out=/dev/null
  [ "$show" = live ] && echo "== KVM tier: $name"
  if [[ $name == vitest-kvm-* ]]; then
    # Runs from the repository; `vitest run` exits 1 when a test fails.
    (cd "$ROOT" && timeout "$suite_limit" node_modules/.bin/vitest run --config vitest.kvm.config.ts "$exe" 2>&1) | tee "$log" > "$out"
    rc=${PIPESTATUS[0]}
    line=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^vitest-kvm: [0-9]+ passed, [0-9]+ failed' | tail -1)
    passed=$(sed -n 's/.* \([0-9]*\) passed.*/\1/p' <<<"$line")
    failed=$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$line")
    ignored=$(sed -n 's/.* \([0-9]*\) skipped.*/\1/p' <<<"$line")
  else
    # cargo runs a test executable in its package's directory.
    (cd "$ROOT/native-vmm" && timeout "$suite_limit" "$exe" 2>&1) | tee "$log" > "$out"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^test result: ' "$log" | tail -1)
    passed=$(sed -n 's/.* \([0-9]*\) passed;.*/\1/p' <<<"$line")
    failed=$(sed -n 's/.* \([0-9]*\) failed;.*/\1/p' <<<"$line")
    ignored=$(sed -n 's/.* \([0-9]*\) ignored;.*/\1/p' <<<"$line")
  fi
  if [ "$show" != live ]; then
    echo "== KVM tier: $name"
    cat "$log"
  fi
  passed=${passed:-0} failed=${failed:-0} ignored=${ignored:-0}
  # A suite that failed without a count of failures (killed, crashed, timed out) counts one.
  if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then failed=1; fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$passed" "$failed" "$ignored" "$rc" $((SECONDS - started)) >> "$results/counts"
}

# prebuild_template NAME RESULTS: builds template NAME into RESULTS/NAME-template once (its
# log there says it was tried) and exports its folder as SANDFORK_TEST_<NAME>_TEMPLATE_DIR;
# where the build fails, the suites build their own.
prebuild_template() {
  local name=$1 results=$2 data=$2/$1-template
  [ -e "$data.log" ] && return
  if (cd "$ROOT" && SANDFORK_DATA_DIR=$data SANDFORK_TEMPLATES=$name SANDFORK_VMM_BOOT_TIMEOUT_MS=$((30000 * SANDFORK_TEST_TIME_SCALE)) \
        node_modules/.bin/tsx runtime/cli/build-templates.ts > "$data.log" 2>&1) && [ -f "$data/templates/$name/template.sfsnap" ]; then
    export "SANDFORK_TEST_${name^^}_TEMPLATE_DIR=$data/templates/$name"
  else
    echo "kvm-tier: building the $name template failed, its suites build their own: $(tail -3 "$data.log")" >&2
  fi
}

# prebuilt_template_of NAME: the template the tier builds once for suite NAME (node for node_kvm and
# e2e.kvm.test.ts, python for the other TypeScript suites: e2e checks that start-up builds
# python), or nothing.
prebuilt_template_of() {
  case $1 in
    node_kvm | vitest-kvm-e2e) echo node ;;
    vitest-kvm-*) echo python ;;
  esac
}

run_here() {
  local results=$1 list=$2 queue=${3:-} name exe show=live
  export SANDFORK_TEST_CPU=kvm SANDFORK_TEST_TIME_SCALE=${SANDFORK_TEST_TIME_SCALE:-1}
  mkdir -p "$results" && : > "$results/counts"
  # With a queue, other QEMU guests run beside this one: their output would interleave with a
  # suite's streamed live, so each suite's log is printed when it ends.
  [ -z "$queue" ] || show=after
  # A suite's wall-clock limit, so that a hung guest costs minutes, not the whole run: 360 s
  # natively (the slowest suite takes ~80 s), 1200 s in QEMU (exactly-once took 590 s in one
  # guest, and more than 750 s with a second guest beside it).
  suite_limit=$((300 + 60 * SANDFORK_TEST_TIME_SCALE))
  local own_pg=0 pg_tried=0
  while IFS=$'\t' read -r name exe; do
    if [ -n "$queue" ]; then
      # Claimed by whichever guest first creates its name in the shared queue (mkdir is atomic on
      # the host's file system, over 9p too). The suites of the node template are claimed as one,
      # so that one guest builds it.
      local claim=$name
      [ "$(prebuilt_template_of "$name")" = node ] && claim=node-template
      [ -e "$results/claimed-$claim" ] || { mkdir "$queue/$claim" 2>/dev/null && : > "$results/claimed-$claim"; } || continue
    fi
    # The PostgreSQL halves of the TypeScript tests: test.sh's server natively; inside a QEMU
    # guest (which reaches no host server) one of its own, in its RAM overlay.
    if [[ $name == vitest-kvm-* ]] && [ -z "${TEST_DATABASE_URL:-}" ] && [ $pg_tried = 0 ]; then
      pg_tried=1
      local pg_env
      if pg_env=$(SANDFORK_PG_DIR=/tmp/sandfork-kvm-tier-pg SANDFORK_PG_PORT=54332 bash "$ROOT/scripts/postgres.sh" start); then
        eval "$pg_env"
        own_pg=1
      else
        echo "kvm-tier: could not start PostgreSQL: the *.kvm.test.ts PostgreSQL variants will fail" >&2
      fi
    fi
    # Templates built once for the suites that run them, which find their folders in
    # SANDFORK_TEST_<NAME>_TEMPLATE_DIR. A build takes ~5 s natively and 146 s in QEMU; each
    # suite building its own would pay it again.
    local template
    template=$(prebuilt_template_of "$name")
    [ -z "$template" ] || prebuild_template "$template" "$results"
    run_suite "$results" "$name" "$exe" "$show"
  done < "$list"
  if [ $own_pg = 1 ]; then SANDFORK_PG_DIR=/tmp/sandfork-kvm-tier-pg bash "$ROOT/scripts/postgres.sh" stop; fi
}

if [ "${1:-}" = --run-here ]; then
  run_here "$2" "$3" "${4:-}"
  exit 0
fi

# ---- on the host ------------------------------------------------------------------------------
MODE=${SANDFORK_KVM_TIER:-auto}
case $MODE in auto|native|qemu) ;; *) echo "kvm-tier: SANDFORK_KVM_TIER=$MODE: expected auto, native or qemu" >&2; exit 2 ;; esac
QEMU_SCALE=${SANDFORK_KVM_TIER_QEMU_SCALE:-15}
QEMU_TIMEOUT=${SANDFORK_KVM_TIER_QEMU_TIMEOUT:-3900}
ONLY=${SANDFORK_KVM_TIER_TESTS:-}

fail_setup() {
  echo "kvm-tier: $*" >&2
  echo "kvm-tier: 0 passed, 1 failed"
  exit 1
}

TIER_DIR=$ROOT/native-vmm/target/kvm-tier
rm -rf "$TIER_DIR" && mkdir -p "$TIER_DIR/results" || fail_setup "cannot create $TIER_DIR"
LIST=$TIER_DIR/suites.tsv

# The test executables, built here (the QEMU guest only runs them), and the VMM binary that the
# probe and the TypeScript tests use.
echo "== KVM tier: building the program tests"
tests=()
for f in native-vmm/tests/*_ptrace.rs native-vmm/tests/*_kvm.rs; do
  [ -e "$f" ] || continue
  t=$(basename "$f" .rs)
  if [ -z "$ONLY" ] || [[ " $ONLY " == *" $t "* ]]; then tests+=(--test "$t"); fi
done
(cd native-vmm && cargo build --release --bin sandfork-vmm 2>&1) || fail_setup "building sandfork-vmm failed"
: > "$LIST"
if [ ${#tests[@]} -gt 0 ]; then
  (cd native-vmm && cargo test --release --no-run --message-format=json-render-diagnostics "${tests[@]}" > "$TIER_DIR/build.json") \
    || fail_setup "building the program tests failed"
  # One JSON object a line; the test targets' executables.
  node -e '
    const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean);
    for (const m of lines.map((l) => JSON.parse(l))) {
      if (m.reason === "compiler-artifact" && m.profile.test && m.target.kind.includes("test") && m.executable) {
        console.log(`${m.target.name}\t${m.executable}`);
      }
    }' "$TIER_DIR/build.json" | sort > "$LIST"
  [ "$(wc -l < "$LIST")" = $((${#tests[@]} / 2)) ] || fail_setup "expected $((${#tests[@]} / 2)) test executables, cargo reported: $(cat "$LIST")"
fi
# The TypeScript ones, a suite a file (so that the QEMU path's guests can share them out).
for f in $(git ls-files '*.kvm.test.ts'); do
  t=vitest-kvm-$(basename "$f" .kvm.test.ts)
  if [ -z "$ONLY" ] || [[ " $ONLY " == *" vitest-kvm "* ]] || [[ " $ONLY " == *" $t "* ]]; then printf '%s\t%s\n' "$t" "$f" >> "$LIST"; fi
done
[ -s "$LIST" ] || fail_setup "SANDFORK_KVM_TIER_TESTS=$ONLY selects nothing"

# The empty migrated PGlite database the TypeScript suites' fresh ones are copied from
# (db/testing/pglite-seed.ts), made here natively: its initdb takes 3-4.5 s natively and ~75 s in a
# QEMU guest, where each suite paid it. In TIER_DIR, which the guests see. Without it the suites
# make their own.
unset SANDFORK_TEST_PGLITE_SEED
if grep -q "^vitest-kvm-" "$LIST"; then
  if (cd "$ROOT" && node_modules/.bin/tsx db/testing/pglite-seed.ts "$TIER_DIR/pglite-seed" > "$TIER_DIR/pglite-seed.log" 2>&1); then
    export SANDFORK_TEST_PGLITE_SEED=$TIER_DIR/pglite-seed
  else
    echo "kvm-tier: making the PGlite seed failed, the suites make their own databases: $(tail -3 "$TIER_DIR/pglite-seed.log")" >&2
  fi
fi

# The module behind /dev/kvm.
kvm_module() {
  for m in kvm_pvm kvm_intel kvm_amd; do [ -d "/sys/module/$m" ] && { echo "$m"; return; }; done
  echo "unknown module"
}

# Does sandfork-vmm run a static C program on this /dev/kvm? Prints "ok" or its output.
probe_vmm() {
  local dir=$TIER_DIR/probe
  mkdir -p "$dir"
  cc -O1 -static -o "$dir/hello" native-vmm/tests/programs/hello.c 2>&1 || return
  printf '{"name": "kvm-probe", "paths": [{"host": "%s", "guest": "/bin/hello"}], "writable_dirs": ["/tmp"]}\n' "$dir/hello" > "$dir/image.json"
  native-vmm/target/release/sandfork-vmm image build --manifest "$dir/image.json" --out "$dir/image" > "$dir/build.log" 2>&1 || { cat "$dir/build.log"; return; }
  local out
  out=$(timeout 60 native-vmm/target/release/sandfork-vmm run --image "$dir/image" --timeout-ms 10000 -- /bin/hello < /dev/null 2>&1)
  if [ $? = 0 ] && [ "$(head -1 <<<"$out")" = "hello from /bin/hello" ]; then echo ok; else echo "$out" | tail -3; fi
}

kvm_status=$(bash scripts/kvm-probe.sh)
case $MODE in
  auto) if [ "$kvm_status" = ok ]; then path=native; else path=qemu; fi ;;
  native) [ "$kvm_status" = ok ] || fail_setup "SANDFORK_KVM_TIER=native, but /dev/kvm: $kvm_status"; path=native ;;
  qemu) path=qemu ;;
esac

if [ $path = native ]; then
  echo "KVM tier: native /dev/kvm ($(kvm_module))"
  vmm_status=$(probe_vmm)
  if [ "$vmm_status" != ok ]; then
    # Honest, not hidden: this /dev/kvm works, so the VMM's failure on it is what the tests report.
    echo "kvm-tier: warning: /dev/kvm creates VMs, but sandfork-vmm did not run a static C program on it:"
    sed 's/^/kvm-tier:   /' <<<"$vmm_status"
    echo "kvm-tier: the tier runs natively anyway: its failures are the VMM's on this KVM (SANDFORK_KVM_TIER=qemu forces the QEMU path)"
  fi
  SANDFORK_TEST_TIME_SCALE=1 bash scripts/kvm-tier.sh --run-here "$TIER_DIR/results/native" "$LIST"
  run_rc=$?
else
  kernel=$(bash scripts/kvm-in-qemu.sh -n) || fail_setup "the QEMU path cannot run here (install its packages with scripts/setup-debian.sh)"
  case $MODE in
    qemu) echo "kvm-tier: SANDFORK_KVM_TIER=qemu: the QEMU path is forced (/dev/kvm here: $kvm_status)" ;;
    *) echo "kvm-tier: /dev/kvm here: $kvm_status: running the tier in a QEMU guest" ;;
  esac
  echo "KVM tier: QEMU TCG, nested SVM, kernel ${kernel#* }"
  # Guests of one vCPU each, side by side: single-threaded TCG, none of the multi-threaded one's
  # cross-vCPU failures (see README), and one host core a guest. Each gets 6 GiB (the RAM
  # overlay holds every file the tests write: images, snapshots), so no more than fit in memory.
  guests=${SANDFORK_KVM_TIER_QEMU_GUESTS:-$(nproc)}
  mem_guests=$(( $(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) / (7 * 1024 * 1024) ))
  if [ -z "${SANDFORK_KVM_TIER_QEMU_GUESTS:-}" ] && [ "$guests" -gt "$mem_guests" ]; then guests=$mem_guests; fi
  [ "$guests" -ge 1 ] 2>/dev/null || guests=1
  # The queue's order: the longest suites first (on the QEMU path, 2026-12-02: 590 s down to
  # ~160 s), so that the guests end close together; the others follow in the list's order.
  ordered=$TIER_DIR/suites-longest-first.tsv
  : > "$ordered"
  for name in vitest-kvm-exactly-once-pglite vitest-kvm-exactly-once-postgres hostile_kvm cpython_compat_kvm agent_ptrace daemon_ptrace sessions_kvm \
              node_kvm vitest-kvm-soak-loaded vitest-kvm-soak vitest-kvm-sessions-crash vitest-kvm-agents vitest-kvm-sessions; do
    grep "^$name	" "$LIST" >> "$ordered"
  done
  grep -v -x -F -f "$ordered" "$LIST" >> "$ordered"
  mkdir -p "$TIER_DIR/queue"
  echo "kvm-tier: booting Debian's kernel ${kernel%% *} in $guests guest(s) sharing the suites (time scale $QEMU_SCALE)"
  pids=()
  for ((g = 0; g < guests; g++)); do
    mkdir -p "$TIER_DIR/results/qemu$g"
    # Each guest's lines carry its number: the guests' outputs interleave.
    (bash scripts/kvm-in-qemu.sh -t "$QEMU_TIMEOUT" -m 6G -w "$TIER_DIR/results/qemu$g" -w "$TIER_DIR/queue" \
       -e SANDFORK_TEST_TIME_SCALE="$QEMU_SCALE" -e SANDFORK_TEST_NODE_FLAGS=--liftoff-only -e CI="${CI:-}" \
       -e SANDFORK_TEST_PGLITE_SEED="${SANDFORK_TEST_PGLITE_SEED:-}" \
       -- bash "$ROOT/scripts/kvm-tier.sh" --run-here "$TIER_DIR/results/qemu$g" "$ordered" "$TIER_DIR/queue" 2>&1 \
       | sed -u "s/^/[qemu $g] /"
     exit "${PIPESTATUS[0]}") &
    pids+=($!)
  done
  run_rc=0
  for pid in "${pids[@]}"; do wait "$pid" || run_rc=$?; done
fi

# ---- the counts ---------------------------------------------------------------------------------
total_passed=0 total_failed=0 total_ignored=0 ran=() unfinished=0
while IFS=$'\t' read -r name passed failed ignored rc secs; do
  ran+=("$name")
  echo "kvm-tier: $name: $passed passed, $failed failed, $ignored ignored (${secs} s, exit code $rc)"
  total_passed=$((total_passed + passed)) total_failed=$((total_failed + failed)) total_ignored=$((total_ignored + ignored))
done < <(cat "$TIER_DIR"/results/*/counts)
while IFS=$'\t' read -r name _; do
  if [[ " ${ran[*]+"${ran[*]}"} " != *" $name "* ]]; then
    echo "kvm-tier: $name: did not run (the run stopped with exit code $run_rc)"
    unfinished=$((unfinished + 1))
  fi
done < "$LIST"
echo "KVM tier: $((total_passed + total_failed)) KVM tests ran on the $path path: $total_passed passed, $total_failed failed; $unfinished suite(s) did not run ($SECONDS s)"
# A suite that did not run, or a run that failed without a failed test, counts as one failure.
total_failed=$((total_failed + unfinished))
if [ "$run_rc" != 0 ] && [ "$total_failed" = 0 ]; then total_failed=1; fi
skipped=; [ "$total_ignored" = 0 ] || skipped=", $total_ignored skipped"
echo "kvm-tier: $total_passed passed, $total_failed failed$skipped"
[ "$total_failed" = 0 ] && [ "$total_passed" -gt 0 ]
