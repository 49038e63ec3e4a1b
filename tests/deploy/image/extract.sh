#!/usr/bin/env bash
# Copies one file out of an image built by build.sh (same BUILDAH_ROOT):
#
#   tests/deploy/image/extract.sh IMAGE_TAG PATH_IN_IMAGE DEST
set -euo pipefail

tag="${1:?usage: extract.sh IMAGE_TAG PATH_IN_IMAGE DEST}"
path="${2:?usage: extract.sh IMAGE_TAG PATH_IN_IMAGE DEST}"
dest="${3:?usage: extract.sh IMAGE_TAG PATH_IN_IMAGE DEST}"
root="${BUILDAH_ROOT:-${TMPDIR:-/tmp}/agentrt-buildah}"
# TMPDIR: buildah's scratch files and its RUN cache mounts (else under
# /var/tmp) stay inside the root.
mkdir -p "$root/tmp"
buildah=(env TMPDIR="$root/tmp" buildah --root "$root/storage" --runroot "$root/run" --storage-driver vfs)

container="$("${buildah[@]}" from --quiet "$tag")"
trap '"${buildah[@]}" rm "$container" >/dev/null' EXIT
mnt="$("${buildah[@]}" mount "$container")"
install -m 0755 "$mnt$path" "$dest"
"${buildah[@]}" umount "$container" >/dev/null
echo "extract: $tag:$path -> $dest"
