#!/usr/bin/env bash
# Build kube-apiserver and kubectl v1.20.2 offline from Debian bookworm's source package
# `kubernetes`, for the tests that run against a real API server (tests/plugins/kube_api.py).
#
#   ./scripts/build-kube.sh          build once; later runs find the cache and cost nothing
#   ./scripts/build-kube.sh --print  print the folder holding the binaries, build nothing
#
# The binaries land in $KUBE_CACHE/v1.20.2/bin/ (KUBE_CACHE defaults to
# /var/cache/slurm-k8s-recover/kube); the Go build cache (about 1.1 GB) sits beside them in
# $KUBE_CACHE/gocache so a rebuild relinks in seconds. No registry ships a kube-apiserver
# binary, and the upstream vendor/ tree needs three fixes to build with Debian's Go 1.19:
#   1. the vendored modern-go/reflect2 1.0.1 crashes on Go >= 1.18: swap in Debian's 1.0.2;
#   2. the generated OpenAPI definitions are not in the tarball: openapi-gen + make gen_openapi;
#   3. the version is stamped into both version packages, or GET /version says v0.0.0-master.
# Needs (installed by scripts/setup.sh): golang-1.19-go golang-github-modern-go-reflect2-dev
# dpkg-dev make, and the Debian mirror named in the machine's own apt sources (or
# $KUBE_DEBIAN_MIRROR). Fails naming the step, with the tail of its log.
set -euo pipefail

readonly VERSION=v1.20.2 MAJOR=1 MINOR=20
readonly CACHE="${KUBE_CACHE:-/var/cache/slurm-k8s-recover/kube}"
readonly DEST="$CACHE/$VERSION"
readonly BIN="$DEST/bin"
readonly GOROOT_DEBIAN=/usr/lib/go-1.19
readonly REFLECT2_DEB=/usr/share/gocode/src/github.com/modern-go/reflect2

if [[ "${1:-}" == "--print" ]]; then echo "$BIN"; exit 0; fi
if [[ -n "${1:-}" ]]; then
  echo "build-kube: unknown option '$1' (valid: --print, or nothing)" >&2; exit 2
fi

TAG=build-kube
# shellcheck source=scripts/lib/build-cache.sh
source "$(dirname "$0")/lib/build-cache.sh"

cached() {
  [[ -x "$BIN/kube-apiserver" && -x "$BIN/kubectl" && -f "$DEST/STAMP" ]] &&
    [[ "$(cat "$DEST/STAMP")" == "$VERSION" ]]
}
if cached; then phase "cached: $BIN (kube-apiserver, kubectl $VERSION)"; exit 0; fi

missing=()
[[ -x "$GOROOT_DEBIAN/bin/go" ]] || missing+=(golang-1.19-go)
[[ -d "$REFLECT2_DEB" ]] || missing+=(golang-github-modern-go-reflect2-dev)
command -v dpkg-source >/dev/null || missing+=(dpkg-dev)
command -v make >/dev/null || missing+=(make)
if ((${#missing[@]})); then
  fail "missing Debian packages: ${missing[*]} (apt-get install ${missing[*]}, or run ./scripts/setup.sh)"
fi

cache_lock "$CACHE" cached

work="$CACHE/work"
rm -rf "$work"
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/apt/parts" "$work/src"
BUILD_LOG="$work/build.log"
: >"$BUILD_LOG"

phase "fetching Debian source package kubernetes (bookworm)"
# The mirror the machine already uses for bookworm; a private apt folder so the system's
# own lists are not touched and no deb-src line is left behind.
mirror="${KUBE_DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  mirror=$(grep -hoE '^(URIs:|deb) +[^ ]*debian/?( |$)' /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -n1 || true)
fi
[[ -n "$mirror" ]] || mirror=http://deb.debian.org/debian
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm main" \
  >"$work/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=$work/apt/parts"
  -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" -q)
step "apt-get update for deb-src $mirror (set KUBE_DEBIAN_MIRROR to another mirror)" \
  apt-get "${apt_opts[@]}" --error-on=any update
(cd "$work/src" && step "apt-get source kubernetes from $mirror" apt-get "${apt_opts[@]}" source --download-only kubernetes)
dsc=$(ls "$work/src"/kubernetes_*.dsc 2>/dev/null | head -n1)
[[ -n "$dsc" ]] || fail "no kubernetes_*.dsc downloaded (see $BUILD_LOG)"
step "unpacking $dsc" dpkg-source --no-check -x "$dsc" "$work/src/kubernetes"
tree="$work/src/kubernetes"
[[ -d "$tree/vendor" && -d "$tree/cmd/kube-apiserver" ]] || fail "unexpected source layout in $tree"

phase "swapping vendored reflect2 1.0.1 for Debian's 1.0.2"
r2="$tree/vendor/github.com/modern-go/reflect2"
[[ -d "$r2" ]] || fail "no vendored reflect2 in $r2"
# 1.0.1 has files 1.0.2 lacks; leaving them would mix the two versions.
rm -f "$r2"/*.go "$r2"/*.s
cp "$REFLECT2_DEB"/*.go "$REFLECT2_DEB"/*.s "$r2"/
rm -f "$r2"/*_test.go

export GOROOT="$GOROOT_DEBIAN" PATH="$GOROOT_DEBIAN/bin:$PATH"
export GOPATH="$work/gopath" GOCACHE="$CACHE/gocache"
export GO111MODULE=off GOPROXY=off CGO_ENABLED=0
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$tree" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"

phase "generating OpenAPI definitions (openapi-gen, make gen_openapi)"
mkdir -p _output/bin
step "go build openapi-gen" go build -o _output/bin/openapi-gen ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
step "make gen_openapi" make gen_openapi

v=k8s.io/kubernetes/vendor/k8s.io
ldflags="-s -w"
for pkg in "$v/component-base/version" "$v/client-go/pkg/version"; do
  ldflags+=" -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=$MAJOR -X $pkg.gitMinor=$MINOR"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
out="$work/bin"
mkdir -p "$out"
phase "building kube-apiserver (about 4 min on 2 cores with a cold Go cache)"
step "go build ./cmd/kube-apiserver" go build -ldflags "$ldflags" -o "$out/kube-apiserver" ./cmd/kube-apiserver
phase "building kubectl"
step "go build ./cmd/kubectl" go build -ldflags "$ldflags" -o "$out/kubectl" ./cmd/kubectl

got=$("$out/kube-apiserver" --version 2>&1 || true)
[[ "$got" == "Kubernetes $VERSION" ]] || fail "built kube-apiserver says '$got', expected 'Kubernetes $VERSION'"

# Publish only complete builds: the STAMP is written last, so a killed build is redone.
rm -rf "$BIN"
mkdir -p "$DEST"
mv "$out" "$BIN"
echo "$VERSION" >"$DEST/STAMP"
cd /
rm -rf "$work"
phase "done: $BIN (kube-apiserver, kubectl $VERSION; Go cache $GOCACHE)"
