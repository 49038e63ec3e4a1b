#!/usr/bin/env bash
# Builds the Python package (a wheel) from the repository's proto/:
#
#   packages/python/build.sh [OUT_DIR]      (default: packages/python/dist)
#
# Installs the pinned build tools (requirements-build.txt) into a venv
# ($AGENTRT_BUILD_VENV, default .ci/.venv-packages), copies the package to a
# scratch directory, generates the messages, stubs and their .pyi there from
# every .proto under proto/agentrt with grpcio-tools and mypy-protobuf, and
# runs `python -m build --wheel` (setuptools). Prints the wheel's path last.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="$(mkdir -p "${1:-$HERE/dist}" && cd "${1:-$HERE/dist}" && pwd)"
VENV="${AGENTRT_BUILD_VENV:-$REPO/.ci/.venv-packages}"

# The package's version is the server's (the workspace's in Cargo.toml).
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")"
grep -qx "version = \"$version\"" "$HERE/pyproject.toml" || {
    echo "build.sh: packages/python/pyproject.toml's version is not the workspace's ($version)" >&2
    exit 1
}

if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --disable-pip-version-check -r "$HERE/requirements-build.txt"

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/agentrt-pybuild.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
cp "$HERE/pyproject.toml" "$HERE/README.md" "$REPO/LICENSE" "$STAGE/"
cp -r "$HERE/src" "$STAGE/src"
find "$STAGE/src" \( -name __pycache__ -o -name '*.pyc' \) -prune -exec rm -rf {} +

mapfile -t protos < <(cd "$REPO/proto" && find agentrt -name '*.proto' | sort)
((${#protos[@]} > 0)) || { echo "build.sh: no .proto files under proto/agentrt" >&2; exit 1; }
(cd "$REPO/proto" && "$PY" -m grpc_tools.protoc -I. \
    --python_out="$STAGE/src" --grpc_python_out="$STAGE/src" \
    --plugin=protoc-gen-mypy="$VENV/bin/protoc-gen-mypy" --mypy_out="$STAGE/src" \
    --plugin=protoc-gen-mypy_grpc="$VENV/bin/protoc-gen-mypy_grpc" --mypy_grpc_out="$STAGE/src" \
    "${protos[@]}") >"$STAGE/protoc.log" 2>&1 || { cat "$STAGE/protoc.log" >&2; exit 1; }
# Every generated directory is a package (agentrt/ already is: the facade).
for proto in "${protos[@]}"; do
    dir="$(dirname "$proto")"
    while [[ "$dir" != agentrt ]]; do
        touch "$STAGE/src/$dir/__init__.py"
        dir="$(dirname "$dir")"
    done
done

"$PY" -m build --wheel --no-isolation --outdir "$OUT" "$STAGE" >"$STAGE/build.log" 2>&1 ||
    { cat "$STAGE/build.log" >&2; exit 1; }
wheel="$OUT/agentrt_client-$version-py3-none-any.whl"
[[ -f "$wheel" ]] || { echo "build.sh: no $wheel after the build" >&2; exit 1; }
echo "$wheel"
