#!/usr/bin/env bash
# Format and lint checks; exits non-zero when any fails, after running them all.
#   native-vmm: `cargo fmt --check` (rustfmt.toml) and clippy with the lint set of Cargo.toml's
#   [lints] tables, warnings as errors; also the library and binary without the default
#   `bench` feature.
#   The import graph of native-vmm/src: no module cycles but those scripts/import-graph.mjs
#   allows, with its reasons.
#   TypeScript/JavaScript: `npm run lint`, Biome's format and lint check (biome.jsonc), warnings
#   as errors; `npm run format` writes the formatting.
set -uo pipefail
cd "$(dirname "$0")/.."

status=0
check() {
  echo "== $*"
  "$@" || status=1
}

check bash -c 'cd native-vmm && cargo fmt --check'
check bash -c 'cd native-vmm && cargo clippy --release --all-targets -- -D warnings'
check bash -c 'cd native-vmm && cargo clippy --release --lib --bins --no-default-features -- -D warnings'
check node scripts/import-graph.mjs
check npm run --silent lint

[ "$status" = 0 ] && echo "lint: clean" || echo "lint: failed"
exit $status
