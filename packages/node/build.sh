#!/usr/bin/env bash
# Builds the npm package (a tarball) from the repository's proto/:
#
#   packages/node/build.sh [OUT_DIR]      (default: packages/node/dist)
#
# `npm ci` (package-lock.json: every build tool pinned), then `npm pack`,
# whose prepack runs `npm run build`: scripts/gen.mjs copies the .proto files
# and generates their TypeScript types, tsc compiles src/ to lib/. Prints the
# tarball's path last.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="$(mkdir -p "${1:-$HERE/dist}" && cd "${1:-$HERE/dist}" && pwd)"

# The package's version is the server's (the workspace's in Cargo.toml).
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")"
grep -q "^  \"version\": \"$version\",\$" "$HERE/package.json" || {
    echo "build.sh: packages/node/package.json's version is not the workspace's ($version)" >&2
    exit 1
}

LOG="$(mktemp "${TMPDIR:-/tmp}/agentrt-npmbuild.XXXXXX")"
trap 'rm -f "$LOG"' EXIT
(cd "$HERE" && npm ci --no-audit --no-fund && npm pack --pack-destination "$OUT") >"$LOG" 2>&1 ||
    { cat "$LOG" >&2; exit 1; }
tarball="$OUT/agentrt-client-$version.tgz"
[[ -f "$tarball" ]] || { echo "build.sh: no $tarball after npm pack" >&2; exit 1; }
echo "$tarball"
