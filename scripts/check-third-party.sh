#!/usr/bin/env bash
# Checks that the vendored third-party trees are byte-identical to their upstream releases
# (third_party/README.md): git's tree hash of each directory, as committed and as checked out.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

declare -A want=(
    [third_party/cloud-hypervisor]=4da74d2795428adf2ab37d596d0121f1f8f0878a
    [third_party/micro_http]=8b1fd342414b8b4fa2de7d05f103c38906f02ff2
)

status=0
for dir in "${!want[@]}"; do
    got=$(git rev-parse "HEAD:$dir" 2>/dev/null || echo missing)
    if [[ $got != "${want[$dir]}" ]]; then
        echo "check-third-party: $dir in HEAD is tree $got, not the release's ${want[$dir]}" >&2
        status=1
    fi
    if ! git diff --quiet HEAD -- "$dir" || [[ -n $(git ls-files --others --exclude-standard -- "$dir") ]]; then
        echo "check-third-party: $dir is changed in the work tree (git status -- $dir)" >&2
        status=1
    fi
done
if ((status == 0)); then
    echo "check-third-party: cloud-hypervisor and micro_http are the upstream trees, unmodified"
fi
exit "$status"
