#!/usr/bin/env bash
# Set up everything on a fresh Debian 12 machine, then run the demo.
#   ./scripts/setup.sh            install + demo
#   ./scripts/setup.sh --no-demo  install only (what .ci/run uses)
# Installs Debian's slurm-wlm and munge (needs root or sudo), creates .venv and installs the
# project with all its extras and the test tools. Safe to run again: it skips what is done.
set -euo pipefail
cd "$(dirname "$0")/.."

run_demo=1
[[ "${1:-}" == "--no-demo" ]] && run_demo=0

export PATH="$PATH:/usr/sbin:/sbin"  # slurmctld, slurmd, munged live there
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: Python >= 3.11 is needed as python3 (Debian 12 ships 3.11)" >&2
  exit 1
fi
need_apt=()
command -v slurmctld >/dev/null || need_apt+=(slurm-wlm)
command -v munged >/dev/null || need_apt+=(munge)
command -v slurmrestd >/dev/null || need_apt+=(slurmrestd slurm-wlm-jwt-plugin)  # REST backend
# The hang scenarios block a training process's main thread with gdb (REFERENCE.md).
command -v gdb >/dev/null || need_apt+=(gdb)
# Debian's own python3 creates venvs only with python3-venv installed.
python3 -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# --- Kubernetes tier: what scripts/build-kube.sh needs to build kube-apiserver and kubectl
# from Debian's source package, plus etcd and openssl for the local API server.
[[ -x /usr/lib/go-1.19/bin/go ]] || need_apt+=(golang-1.19-go)
[[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ]] ||
  need_apt+=(golang-github-modern-go-reflect2-dev)
command -v dpkg-source >/dev/null || need_apt+=(dpkg-dev)
command -v make >/dev/null || need_apt+=(make)
command -v etcd >/dev/null || need_apt+=(etcd-server)
command -v openssl >/dev/null || need_apt+=(openssl)
# --- end Kubernetes tier
# The agent's and coordinator's images (scripts/build-images.sh, tests/install/test_images.py)
command -v buildah >/dev/null || need_apt+=(buildah)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
if ((${#need_apt[@]})); then
  echo "== installing Debian packages: ${need_apt[*]}"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}"
fi
# Prometheus' promtool checks the coordinator's and the agent's scrapes; the server itself is
# never started here (a policy-rc.d keeps its package from starting it, and its recommends,
# node-exporter among them, are left out).
if ! command -v promtool >/dev/null; then
  echo "== installing Debian's prometheus (for promtool)"
  ((${#need_apt[@]})) || as_root apt-get update -q
  policy=/usr/sbin/policy-rc.d
  made_policy=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod +x "$policy"
    made_policy=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    prometheus
  [[ -z $made_policy ]] || as_root rm -f "$policy"
fi

# PostgreSQL 15: the coordinator's journal for replicas on several machines (--journal-dsn).
# The tests start a private server of their own (tests/plugins/postgres.py); the package's
# own cluster is never started here (the same policy-rc.d as above).
if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
  echo "== installing Debian's postgresql-15 (the journal's server, for the tests)"
  as_root apt-get update -q
  policy=/usr/sbin/policy-rc.d
  made_policy=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod +x "$policy"
    made_policy=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    postgresql-15
  [[ -z $made_policy ]] || as_root rm -f "$policy"
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
echo "== installing Python packages into .venv"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[all,dev]'

# --- Kubernetes tier: build once (about 6 min on 2 cores); cached by version afterwards.
echo "== kube-apiserver and kubectl for the Kubernetes tests"
as_root ./scripts/build-kube.sh
# --- end Kubernetes tier

# --- Slurm 25.11 tier: built once from its release source (about 3 min idle, cached by
# version; scripts/build-slurm.sh). Exit 3 means the source cannot be had here (no network and
# no SLURM_SOURCE): everything then runs on Debian's 22.05.
echo "== Slurm 25.11 (expedited requeue, slurmrestd node updates, pyslurm)"
slurm_rc=0
as_root ./scripts/build-slurm.sh || slurm_rc=$?
if ((slurm_rc == 3)); then
  echo "== Slurm 25.11 not built (source not available); carrying on with Debian's Slurm 22.05"
elif ((slurm_rc != 0)); then
  exit "$slurm_rc"
else
  # pyslurm (--slurm-backend pyslurm) compiles against that build: PyPI has only releases
  # for Slurm 25.11, and no wheel, so pip builds the sdist (about 3 min on 2 cores).
  slurm_prefix=$(./scripts/build-slurm.sh --print)
  # Asked of pip, not by importing it: libslurm exits the process without a SLURM_CONF.
  if ! .venv/bin/python -m pip show -q pyslurm >/dev/null 2>&1; then
    echo "== building pyslurm against $slurm_prefix"
    SLURM_INCLUDE_DIR="$slurm_prefix/include" SLURM_LIB_DIR="$slurm_prefix/lib" \
      .venv/bin/python -m pip install -q "pyslurm==${PYSLURM_VERSION:-25.11.2}"
  fi
fi
# --- end Slurm 25.11 tier

if ((run_demo)); then
  exec ./scripts/demo.sh
fi
