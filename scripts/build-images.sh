#!/usr/bin/env bash
# Build the two images k8s/deploy runs (the node agent and the coordinator) from the
# Containerfile with buildah: daemonless, as root, from Debian's packages.
#
#   ./scripts/build-images.sh                  # base made locally, tags <name>:<version>
#   ./scripts/build-images.sh --base IMAGE     # any Debian-based image with python3 >= 3.11
#
# Without --base, a minimal Debian 12 base with python3 and its venv module is made once with
# debootstrap (from deb.debian.org, about 1 min) and kept in buildah's storage as
# localhost/slurm-k8s-recover-base:bookworm, so a machine that reaches no image registry
# builds too. Storage is vfs and RUN steps use chroot isolation unless STORAGE_DRIVER and
# BUILDAH_ISOLATION say otherwise: both work in a container without privileges of its own.
# The host's CA bundle is mounted into RUN steps, so pip works behind a TLS-inspecting proxy.
# tests/install/test_images.py builds both and checks what each image holds.
set -euo pipefail
cd "$(dirname "$0")/.."

base=""
while (($#)); do
  case "$1" in
    --base) base="${2:?--base needs an image}"; shift 2 ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build-images: unknown option $1 (expected --base IMAGE)" >&2; exit 2 ;;
  esac
done

say() { echo "== build-images [$(printf '%4d' "$SECONDS")s] $*"; }
if [[ $(id -u) -ne 0 ]]; then
  echo "build-images: run as root (buildah's vfs storage and chroot isolation need it)" >&2
  exit 1
fi
for tool in buildah debootstrap; do
  if ! command -v "$tool" >/dev/null; then
    echo "build-images: $tool is missing: apt-get install buildah debootstrap" >&2
    exit 1
  fi
done
export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}" BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)

if [[ -z "$base" ]]; then
  base=localhost/slurm-k8s-recover-base:bookworm
  if buildah inspect --type image "$base" >/dev/null 2>&1; then
    say "base $base (made before)"
  else
    say "making $base with debootstrap (Debian 12, python3, python3-venv)"
    rootfs=$(mktemp -d /tmp/recover-base.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm "$rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$rootfs.log" 2>&1 ||
      { tail -n 20 "$rootfs.log" >&2; echo "build-images: debootstrap failed" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    ctr=$(buildah from scratch)
    buildah add "$ctr" "$rootfs" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --cmd /bin/bash "$ctr"
    buildah commit --quiet --rm "$ctr" "$base" >/dev/null
    rm -f "$rootfs.log"
    say "base $base made"
  fi
fi

mounts=()
[[ -f /etc/ssl/certs/ca-certificates.crt ]] &&
  mounts=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
for target in agent coordinator; do
  tag="slurm-k8s-recover-$target:$version"
  say "building $tag (target $target)"
  log=$(mktemp /tmp/recover-image-$target.XXXXXX.log)
  if ! buildah build --quiet "${mounts[@]}" --build-arg "BASE=$base" \
      --target "$target" -t "$tag" . >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "build-images: building $tag failed (whole log: $log)" >&2
    exit 1
  fi
  rm -f "$log"
  say "built localhost/$tag"
done
# A rebuild leaves the previous images untagged: drop them (vfs keeps whole copies).
buildah rmi --prune >/dev/null 2>&1 || true
