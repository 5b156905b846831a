#!/usr/bin/env bash
# Builds what templates/node/image.json takes from this folder besides agent.js: the agent's
# native addon, build/sandfork_native.node, from sandfork_native.c against the Node-API headers
# of the Node.js that runs the agent (/usr/include/node, from Debian's nodejs package). Run
# before the image is built (runtime/templates.ts, the Rust tests); a no-op when the addon is
# newer than its source, so the image's inputs do not change.
set -euo pipefail
cd "$(dirname "$0")"
out=build/sandfork_native.node
if [ -f "$out" ] && [ "$out" -nt sandfork_native.c ]; then exit 0; fi
mkdir -p build
# Built beside, then renamed: concurrent builds never see a partial addon.
tmp=$(mktemp build/.sandfork_native.XXXXXX)
trap 'rm -f "$tmp"' EXIT
cc -shared -fPIC -O2 -Wall -Wextra -Werror -I"${NODE_INCLUDE_DIR:-/usr/include/node}" -o "$tmp" sandfork_native.c
chmod 644 "$tmp"
mv "$tmp" "$out"
