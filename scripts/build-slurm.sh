#!/usr/bin/env bash
# Build Slurm 25.11.7 from its release source, once, into a cache kept by version; the local
# cluster (`recover cluster up --slurm 25.11`), the pyslurm backend and slurmrestd's v0.0.44
# API use it. Debian 12 only ships Slurm 22.05.
#
#   ./scripts/build-slurm.sh          build once; later runs find the cache and cost nothing
#   ./scripts/build-slurm.sh --print  print the install folder (built or not), build nothing
#
# SLURM_SOURCE  a path or an http(s) URL of the release tarball (.tar.xz or .tar.bz2);
#               default: SchedMD's release download (needs internet)
# SLURM_SHA256  the tarball's sha256, when it is neither of the sums below
# SLURM_CACHE   where builds live (default /var/cache/slurm-k8s-recover/slurm)
#
# The install lands in $SLURM_CACHE/25.11.7 (configure's prefix, so plugins and the rpath point
# there). Build deps missing from Debian are installed with apt-get (needs root or sudo).
# Exit codes: 0 built or cached; 3 the source cannot be had (one line says why; scripts/setup.sh
# then carries on with Debian's 22.05); 1 anything else, naming the step, with its log's tail.
set -euo pipefail
TAG=build-slurm
# shellcheck source=scripts/lib/build-cache.sh
source "$(dirname "$0")/lib/build-cache.sh"

readonly VERSION=25.11.7
readonly CACHE="${SLURM_CACHE:-/var/cache/slurm-k8s-recover/slurm}"
readonly DEST="$CACHE/$VERSION"
readonly UPSTREAM="https://download.schedmd.com/slurm/slurm-$VERSION.tar.bz2"
# The release tarball's sum (.tar.xz as vendored), and the sum of the tar inside it: the same
# tar compressed another way (SchedMD's .tar.bz2) is accepted by the second.
readonly SUM_XZ=f71f1e5f33a72e7864104a6857e86862eac3c4e5e348c92dd0c10dbe03a82dec
readonly SUM_TAR=11eb6b6bdb05e92700261f314dedd3f3eb1d08f0a78e09dcb997a82522b6c150
readonly DEPS=(build-essential pkg-config libmunge-dev libjson-c-dev libyaml-dev libjwt-dev
  libhttp-parser-dev libdbus-1-dev python3-dev)

if [[ "${1:-}" == "--print" ]]; then echo "$DEST"; exit 0; fi
if [[ -n "${1:-}" ]]; then
  echo "build-slurm: unknown option '$1' (valid: --print, or nothing)" >&2; exit 2
fi

cached() {
  [[ -x "$DEST/sbin/slurmctld" && -x "$DEST/bin/scontrol" && -f "$DEST/STAMP" ]] &&
    [[ "$(cat "$DEST/STAMP")" == "$VERSION" ]]
}
if cached; then phase "cached: $DEST (Slurm $VERSION), nothing to build"; exit 0; fi

no_source() { echo "build-slurm: no Slurm $VERSION source: $*" >&2; exit 3; }
source_arg="${SLURM_SOURCE:-$UPSTREAM}"
case "$source_arg" in
  http://* | https://*) ;;
  *) [[ -f "$source_arg" ]] || no_source "$source_arg does not exist (set SLURM_SOURCE to the tarball)" ;;
esac

cache_lock "$CACHE" cached
work=$(mktemp -d "$CACHE/.build-$VERSION.XXXXXX")
trap 'rm -rf "$work"' EXIT
BUILD_LOG="$work/build.log"
: >"$BUILD_LOG"

tarball="$work/$(basename "$source_arg")"
if [[ "$source_arg" == http* ]]; then
  phase "downloading $source_arg"
  curl -fsSL --connect-timeout 10 --max-time 600 -o "$tarball" "$source_arg" 2>>"$BUILD_LOG" ||
    no_source "cannot download $source_arg (no network? set SLURM_SOURCE to a local tarball)"
else
  cp "$source_arg" "$tarball"
fi

phase "checking sha256 of $(basename "$tarball")"
case "$tarball" in
  *.tar.xz) unpack=(xz -dc) ;;
  *.tar.bz2) unpack=(bzip2 -dc) ;;
  *.tar.gz | *.tgz) unpack=(gzip -dc) ;;
  *) fail "$tarball: expected a .tar.xz, .tar.bz2 or .tar.gz" ;;
esac
got=$(sha256sum <"$tarball" | cut -d' ' -f1)
if [[ -n "${SLURM_SHA256:-}" ]]; then
  [[ "$got" == "$SLURM_SHA256" ]] || fail "$tarball has sha256 $got, SLURM_SHA256 says $SLURM_SHA256"
elif [[ "$got" != "$SUM_XZ" ]]; then
  inner=$("${unpack[@]}" <"$tarball" | sha256sum | cut -d' ' -f1)
  [[ "$inner" == "$SUM_TAR" ]] ||
    fail "$tarball is not Slurm $VERSION's release: sha256 $got (tar inside: $inner); expected $SUM_XZ or a tar of $SUM_TAR (set SLURM_SHA256 to accept another)"
fi

missing=()
for p in "${DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  phase "installing build deps: ${missing[*]}"
  as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
  step "apt-get update" as_root apt-get update -q
  step "apt-get install ${missing[*]}" as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q "${missing[@]}"
fi

phase "unpacking"
mkdir "$work/src"
"${unpack[@]}" <"$tarball" | tar -x -C "$work/src" --strip-components=1 ||
  fail "cannot unpack $tarball"
cd "$work/src"
phase "configure (prefix $DEST)"
step configure ./configure --prefix="$DEST" --sysconfdir="$DEST/etc" --enable-multiple-slurmd \
  --with-jwt --with-json --with-http-parser --with-yaml --disable-dependency-tracking
jobs=$(nproc 2>/dev/null || echo 2)
phase "make -j$jobs (about 3 min on 2 idle cores, much longer under load)"
step make make -j"$jobs"
phase "make install (staged, then moved into place)"
step "make install" make install DESTDIR="$work/stage"
[[ -x "$work/stage$DEST/sbin/slurmctld" ]] || fail "make install left no slurmctld in $work/stage$DEST"
# The version the headers carry, as 0xMMmmuu (running scontrol would need a slurm.conf, even
# for --version).
IFS=. read -r vmaj vmin vmic <<<"$VERSION"
number=$(printf '0x%02x%02x%02x' "$vmaj" "$vmin" "$vmic")
header="$work/stage$DEST/include/slurm/slurm_version.h"
grep -qi "SLURM_VERSION_NUMBER $number" "$header" 2>/dev/null ||
  fail "the installed $header does not say $VERSION ($number)"

rm -rf "$DEST"
mv "$work/stage$DEST" "$DEST"
echo "$VERSION" >"$DEST/STAMP"
phase "done: $DEST (Slurm $VERSION, $(du -sh "$DEST" | cut -f1))"
