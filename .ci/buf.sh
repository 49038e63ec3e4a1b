#!/usr/bin/env bash
# buf lint and buf breaking on proto/ (the module configured by proto/buf.yaml).
#
#   bash .ci/buf.sh            # lint, then breaking against the baseline below
#   bash .ci/buf.sh lint       # only lint
#   bash .ci/buf.sh breaking [REF]   # only breaking, against REF if given
#
# The buf CLI comes pinned from .ci/buf/package-lock.json (npm ci).
#
# Breaking baseline: the proto/ tree just before the newest commit on main's
# first-parent line that changed proto/ (for a commit that changes protos
# that is its parent, i.e. "the previous commit of main"; for later commits
# that leave proto/ alone the check still covers the last proto change).
# A deliberate break is allowed by a `Proto-Breaking: <why>` trailer in that
# commit's message, or by AGENTRT_ALLOW_BREAKING_PROTO=1 for a local run;
# either way buf's findings are still printed.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

BUF_DIR="$REPO_ROOT/.ci/buf"
BUF="$BUF_DIR/node_modules/.bin/buf"
want="$(node -p "require('$BUF_DIR/package.json').dependencies['@bufbuild/buf']")"
if [[ ! -x "$BUF" ]] || [[ "$("$BUF" --version 2>/dev/null)" != "$want" ]]; then
    echo "buf: npm ci in .ci/buf (@bufbuild/buf $want)"
    (cd "$BUF_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "buf: $("$BUF" --version)"

mode="${1:-all}"

if [[ "$mode" == all || "$mode" == lint ]]; then
    echo "buf: lint proto (STANDARD, exceptions in proto/buf.yaml)"
    "$BUF" lint proto
    echo "buf: lint clean"
fi

if [[ "$mode" == all || "$mode" == lint ]]; then
    # Our own files (not the vendored ones) say where generated code goes in
    # each language; a new file without them would land in odd packages.
    missing=0
    while IFS= read -r file; do
        for opt in csharp_namespace go_package java_multiple_files java_outer_classname java_package objc_class_prefix php_namespace ruby_package; do
            if ! grep -qE "^option ${opt} = " "$file"; then
                echo "buf: $file declares no 'option ${opt}' (see proto/agentrt/v1/common.proto)" >&2
                missing=1
            fi
        done
    done < <(find proto/agentrt -name '*.proto' | sort)
    ((missing == 0)) || exit 1
    echo "buf: every proto/agentrt file declares its language options"
fi

if [[ "$mode" == all || "$mode" == breaking ]]; then
    ref="${2:-}"
    allowed=""
    if [[ -z "$ref" ]]; then
        if ! git rev-parse --verify -q HEAD >/dev/null; then
            echo "buf: not a git checkout; cannot run buf breaking" >&2
            exit 1
        fi
        change="$(git log -1 --first-parent --format=%H -- proto)"
        if [[ -z "$change" ]]; then
            echo "buf: no commit touches proto/; nothing to compare" >&2
            exit 1
        fi
        if ! git rev-parse --verify -q "${change}^1" >/dev/null; then
            # A shallow clone: fetch the one commit the check needs.
            git fetch -q --deepen=2 origin 2>/dev/null || true
        fi
        if ! git rev-parse --verify -q "${change}^1" >/dev/null; then
            echo "buf: ${change:0:12} (the last change to proto/) has no parent in this clone" >&2
            echo "buf: clone with history (not --depth 1) so buf breaking has a baseline" >&2
            exit 1
        fi
        ref="$(git rev-parse "${change}^1")"
        echo "buf: the last change to proto/ is ${change:0:12} ($(git log -1 --format=%s "$change"))"
        if git log -1 --format=%B "$change" | grep -qiE '^Proto-Breaking:'; then
            allowed="commit ${change:0:12} says: $(git log -1 --format=%B "$change" | grep -iE '^Proto-Breaking:' | head -1)"
        fi
    fi
    if [[ "${AGENTRT_ALLOW_BREAKING_PROTO:-}" == 1 ]]; then
        allowed="AGENTRT_ALLOW_BREAKING_PROTO=1"
    fi
    echo "buf: breaking proto against ${ref:0:12} (FILE rules)"
    if "$BUF" breaking proto --against "$REPO_ROOT/.git#ref=$ref,subdir=proto"; then
        echo "buf: no breaking change"
    elif [[ -n "$allowed" ]]; then
        echo "buf: breaking changes above are allowed: $allowed"
    else
        echo "buf: BREAKING proto change against ${ref:0:12} (listed above)." >&2
        echo "buf: keep the old names and numbers, or, if the break is deliberate, say why in a" >&2
        echo "buf: 'Proto-Breaking: <reason>' trailer of the commit that makes it." >&2
        exit 1
    fi
fi
