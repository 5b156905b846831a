#!/usr/bin/env bash
# The project's whole test suite: the Rust VMM (cargo test) and the TypeScript packages (vitest),
# the latter against a real PostgreSQL server and embedded PGlite.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-debian.sh

started_pg=0
if [ -z "${TEST_DATABASE_URL:-}" ]; then
  pg_env=$(bash scripts/postgres.sh start)
  eval "$pg_env"
  started_pg=1
fi
cleanup() { if [ "$started_pg" = 1 ]; then bash scripts/postgres.sh stop; fi; }
trap cleanup EXIT

echo "== native-vmm: cargo test"
(cd native-vmm && cargo test --release 2>&1)

echo "== TypeScript: vitest (PostgreSQL at $TEST_DATABASE_URL, and PGlite)"
npm run --silent test:ts
