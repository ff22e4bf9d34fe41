#!/usr/bin/env bash
# Builds the test control plane (tests/cluster/*.go) once per source hash and prints the path
# of the binary. The binary lives outside the repository, under
#   ${WEIGHTCACHE_CACHE:-$HOME/.cache/weightcache}/cluster/<hash>/kcluster
# so a fresh clone with unchanged sources reuses it and nothing built is ever committed.
# A cold build (empty Go build cache) compiles most of Kubernetes: minutes, not seconds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${WEIGHTCACHE_CACHE:-$HOME/.cache/weightcache}/cluster"
# CI shells may lack the toolchain on PATH; /usr/local/go is where this machine keeps it.
go_bin="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

# The key covers everything that changes the binary: this script (flags), module pins,
# sources, and the toolchain.
key="$(cd "$here" && { cat build.sh go.mod go.sum ./*.go; "$go_bin" version; } | sha256sum | cut -c1-16)"
target="$cache_root/$key/kcluster"
if [[ -x "$target" ]]; then
    echo "$target"
    exit 0
fi

mkdir -p "$cache_root/$key"
# Two test sessions starting at once must not build twice into the same place.
exec 9>"$cache_root/$key/.lock"
flock 9
if [[ ! -x "$target" ]]; then
    started=$(date +%s)
    echo "building the test control plane into $target (cold: several minutes)" >&2
    # Upstream stamps the version at link time; without it the server reports
    # v0.0.0-master, which kubectl cannot parse and chart kubeVersion constraints reject.
    version="$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$here/go.mod")"
    minor="$(echo "$version" | cut -d. -f2)"
    stamp=""
    for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        stamp+=" -X $package.gitVersion=$version -X $package.gitMajor=1 -X $package.gitMinor=$minor"
        stamp+=" -X $package.gitTreeState=clean -X $package.buildDate=1970-01-01T00:00:00Z"
    done
    (cd "$here" && GOFLAGS="-mod=readonly -buildvcs=false" \
        "$go_bin" build -trimpath -ldflags="-s -w$stamp" -o "$target.partial" .) >&2
    mv "$target.partial" "$target"
    echo "built in $(( $(date +%s) - started ))s" >&2
    # Each build is ~120 MB; keep the three newest so other branches' binaries survive.
    ls -1dt "$cache_root"/*/ | tail -n +4 | xargs -r rm -rf
fi
echo "$target"
