#!/usr/bin/env bash
# Installs the Debian packages the project needs, when any is missing (needs root then):
# postgresql (the real server the tests use), python3.11 and python3-numpy (what the Python
# template's image is built from), pandas, matplotlib, scipy and scikit-learn (the python-data
# template's), build-essential (cc for the C test programs and for the
# guest vDSO that native-vmm/build.rs compiles), the Rust crates native-vmm builds against
# (librust-*-dev: source under /usr/share/cargo/registry, see .cargo/config.toml), chromium
# (the /docs browser test), libpython3.11-testsuite (CPython's own regression tests, which
# `npm run test:cpython` runs in the VM), and Rust from Debian's cargo-web when the machine has
# no toolchain (Debian 12's plain `cargo` is too old).
#
# The KVM test tier (scripts/kvm-tier.sh) runs on this machine's /dev/kvm where it can create a
# VM. Where it cannot (or with SANDFORK_KVM_TIER=qemu), the tier runs in a QEMU guest, and this
# script also installs what that needs: qemu-system-x86, linux-image-amd64 (the guest's kernel:
# it only adds files under /boot and /lib/modules, and is never booted on the host),
# busybox-static, cpio, kmod, xz-utils (~500 MB, about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."

# Prints the packages of $@ that are not installed.
missing_of() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

# apt-get install of $@ (as root), with the options in $APT_OPTIONS.
install() {
  if [ "$(id -u)" != 0 ]; then
    echo "scripts/setup-debian.sh: missing Debian packages: $*; install them as root: apt-get install -y $*" >&2
    exit 1
  fi
  echo "installing Debian packages: $*"
  export DEBIAN_FRONTEND=noninteractive
  if [ "${apt_updated:-0}" = 0 ]; then apt-get update -qq; apt_updated=1; fi
  # shellcheck disable=SC2086
  apt-get install -y -qq ${APT_OPTIONS:-} "$@" >/dev/null
}

packages=(postgresql python3.11 python3-numpy build-essential)
# What the templates give programs to run: a shell and its tools, git, pip and venv.
packages+=(dash bash coreutils grep sed mawk findutils tar gzip xz-utils zip unzip diffutils patch make git python3-pip python3-venv)
packages+=(librust-serde-dev librust-serde-derive-dev librust-serde-json-dev librust-sha2-dev librust-base64-dev librust-libc-dev librust-serde-path-to-error-dev librust-fixedbitset-dev librust-xxhash-rust-dev)
packages+=(chromium libpython3.11-testsuite)
# The Python template's image: tzdata, netbase's services and protocols.
packages+=(tzdata netbase)
# The cluster's tests: openssl makes their certificates, iproute2 their network namespaces.
packages+=(openssl iproute2)
# The python-data template's packages (templates/python-data/template.json).
packages+=(python3-pandas python3-matplotlib python3-scipy python3-sklearn)
command -v cargo >/dev/null || packages+=(cargo-web rustc-web)
mapfile -t missing < <(missing_of "${packages[@]}")
[ ${#missing[@]} -eq 0 ] || install "${missing[@]}"

# The KVM tier's QEMU path, decided as scripts/kvm-tier.sh decides it.
if [ "${SANDFORK_KVM_TIER:-auto}" = qemu ] || [ "$(bash scripts/kvm-probe.sh)" != ok ]; then
  mapfile -t missing < <(missing_of qemu-system-x86 linux-image-amd64 busybox-static cpio kmod xz-utils)
  [ ${#missing[@]} -eq 0 ] || APT_OPTIONS=--no-install-recommends install "${missing[@]}"
fi
exit 0
