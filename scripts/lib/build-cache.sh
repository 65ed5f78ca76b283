# Shared steps of the scripts that build a tool once and cache it by version
# (build-kube.sh, build-slurm.sh). Source it after setting TAG (the name printed before each
# line) and `set -euo pipefail`; it defines:
#   phase MSG...          progress line with seconds since the script started
#   fail MSG...           one error line on stderr, exit 1
#   cache_lock DIR FN     take DIR/.lock (one build at a time: setup.sh and a test session may
#                         both ask); a loser waits for the winner, then exits 0 if FN (a
#                         "is it cached?" function) now says the build is there
#   step WHAT CMD...      run CMD with its output appended to $BUILD_LOG; on failure print the
#                         log's tail and fail naming WHAT
# Builds go into a work folder and are renamed into place only when complete, with the stamp
# written last, so a killed build is redone rather than half used.

_build_start=$SECONDS
phase() { printf '== %s [%4ds] %s\n' "$TAG" "$((SECONDS - _build_start))" "$*"; }
fail() { echo "$TAG: FAILED: $*" >&2; exit 1; }

cache_lock() {
  local dir="$1" cached_fn="$2"
  mkdir -p "$dir" || fail "cannot create $dir (set the cache variable to a writable folder)"
  exec 9>"$dir/.lock"
  if ! flock -n 9; then
    phase "another build holds $dir/.lock; waiting for it"
    flock 9
    if "$cached_fn"; then phase "cached by the other build: nothing to build"; exit 0; fi
  fi
}

BUILD_LOG=/dev/null
step() {
  local what="$1"; shift
  if ! "$@" >>"$BUILD_LOG" 2>&1; then
    tail -n 40 "$BUILD_LOG" >&2
    fail "$what (full log: $BUILD_LOG)"
  fi
}
