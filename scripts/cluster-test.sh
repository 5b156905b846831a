#!/usr/bin/env bash
# `npm run test:cluster`: the multi-host test (cluster/testing/cluster-run.ts). Three hosts as
# network namespaces, each a node and a gateway, PostgreSQL in a namespace of its own, Debian's
# HAProxy in front. Needs root. Where /dev/kvm cannot create a VM (scripts/kvm-probe.sh), or with
# SANDFORK_CLUSTER_TEST=qemu, it runs inside a QEMU guest (scripts/kvm-in-qemu.sh) with the
# test's counts cut and its waits scaled (SANDFORK_TEST_TIME_SCALE=15): for correctness, not
# figures. Installs haproxy when missing; ends with `cluster: N passed, N failed`.
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
if [ "$(bash scripts/kvm-probe.sh)" != ok ] || [ "${SANDFORK_CLUSTER_TEST:-auto}" = qemu ]; then
  exec bash scripts/kvm-in-qemu.sh -m 8G -t 3600 -e SANDFORK_TEST_TIME_SCALE=15 -- \
    npx tsx cluster/testing/cluster-run.ts
fi
exec npx tsx cluster/testing/cluster-run.ts
