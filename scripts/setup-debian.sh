#!/usr/bin/env bash
# Installs the Debian packages the project needs, when any is missing (needs root then):
# postgresql (the real server the tests use), python3.11 and python3-numpy (what the Python
# template's image is built from), build-essential (cc for the C test programs), the Rust crates
# native-vmm builds against (librust-*-dev: source under /usr/share/cargo/registry, see
# native-vmm/.cargo/config.toml), chromium (the /docs browser test), and Rust from Debian's
# cargo-web when the machine has no toolchain (Debian 12's plain `cargo` is too old).
set -euo pipefail

packages=(postgresql python3.11 python3-numpy build-essential)
packages+=(librust-serde-dev librust-serde-derive-dev librust-serde-json-dev librust-sha2-dev librust-base64-dev librust-libc-dev librust-serde-path-to-error-dev)
packages+=(chromium)
command -v cargo >/dev/null || packages+=(cargo-web rustc-web)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "scripts/setup-debian.sh: missing Debian packages: ${missing[*]}; install them as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
