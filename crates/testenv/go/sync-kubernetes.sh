#!/usr/bin/env bash
# Points this module at one k8s.io/kubernetes release.
#
# k8s.io/kubernetes requires its staging modules at v0.0.0 and resolves them
# with `replace => ./staging/...` directives that do not apply to consumers.
# This script reads those directives from the release's own go.mod and
# replaces each staging module with its published v0.<minor>.<patch> tag, so
# the list never drifts from upstream by hand-editing.
#
# Usage: ./sync-kubernetes.sh v1.37.2
set -euo pipefail
version=${1:?usage: $0 vMAJOR.MINOR.PATCH}
staging=v0.${version#v1.}
cd "$(dirname "$0")"

gomod=$(go mod download -json "k8s.io/kubernetes@${version}" |
  sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -f "$gomod" ] || { echo "could not download k8s.io/kubernetes@${version}" >&2; exit 1; }

modules=$(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*#\1#p' "$gomod")
[ -n "$modules" ] || { echo "no staging replaces found in $gomod" >&2; exit 1; }

args=()
for m in $modules; do
  args+=("-replace=${m}=${m}@${staging}")
done
go mod edit "${args[@]}" "-require=k8s.io/kubernetes@${version}"
echo "${version}" > KUBERNETES_VERSION
go mod tidy
echo "replaced $(wc -w <<<"$modules") staging modules with ${staging}"
