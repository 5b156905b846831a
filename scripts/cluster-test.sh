#!/usr/bin/env bash
# `npm run test:cluster`: the multi-host test (cluster/testing/cluster-run.ts). Three hosts as
# network namespaces, each a node and a gateway, PostgreSQL in a namespace of its own, Debian's
# HAProxy in front. Needs root and a /dev/kvm that runs guests (elsewhere run it inside
# scripts/kvm-in-qemu.sh). Installs haproxy when missing; ends with `cluster: N passed, N failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "test:cluster makes network namespaces: run it as root" >&2
  exit 2
fi
if ! command -v haproxy >/dev/null; then
  apt-get install -y haproxy >/dev/null
fi
bash scripts/setup-debian.sh >/dev/null
cargo build --release --manifest-path native-vmm/Cargo.toml
exec npx tsx cluster/testing/cluster-run.ts
