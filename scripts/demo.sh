#!/usr/bin/env bash
# Demo: a training run is killed (SIGKILL, no chance to save) in the middle of its work,
# the newest checkpoint is damaged on top of that, and `recover train --resume` still ends
# bit-for-bit where an uninterrupted run ends. Then (as root) `recover demo`: the same story
# on a real local Slurm cluster, where a GPU falls off the bus and a spare replaces the node.
set -euo pipefail
cd "$(dirname "$0")/.."
recover=.venv/bin/recover
demo=${DEMO_DIR:-runs/demo}
rm -rf "$demo"
mkdir -p "$demo"
cache="$demo/compile-cache"

# final_digest RUN_DIR: the state digest of the run's last `completed` event
final_digest() {
  grep '"completed"' "$1/events.jsonl" | tail -1 | sed 's/.*"state_digest": "\([0-9a-f]*\)".*/\1/'
}
# same_or_fail WANT GOT SUCCESS-MESSAGE
same_or_fail() {
  if [[ "$1" == "$2" ]]; then echo "OK: $3"; else echo "MISMATCH: $1 != $2" >&2; exit 1; fi
}

echo "== 1. uninterrupted control run: 30 steps"
$recover train --run-dir "$demo/control" --steps 30 --save-every 5 --model mlp-small \
  --compile-cache "$cache"

echo "== 2. the same run, SIGKILLed once it has passed step 17"
$recover train --run-dir "$demo/run" --steps 30 --save-every 5 --model mlp-small \
  --step-sleep 0.1 --compile-cache "$cache" &
pid=$!
until grep -q '"event": "step", [^}]*"step": 17,' "$demo/run/events.jsonl" 2>/dev/null; do sleep 0.05; done
kill -KILL "$pid"; wait "$pid" 2>/dev/null || true
echo "killed pid $pid"
$recover checkpoint ls "$demo/run"

echo "== 3. flip one byte in the newest checkpoint (a bad disk, a torn copy)"
newest=$(ls -d "$demo"/run/checkpoints/step_* | tail -1)
leaf=$(ls -S "$newest"/D*.bin | head -1)  # the largest data file
printf '\xff' | dd of="$leaf" bs=1 seek=100 conv=notrunc status=none
$recover checkpoint ls "$demo/run" || true

echo "== 4. resume: falls back to the newest checkpoint that verifies"
$recover train --run-dir "$demo/run" --steps 30 --save-every 5 --model mlp-small \
  --resume --compile-cache "$cache"

want=$(final_digest "$demo/control")
got=$(final_digest "$demo/run")
grep -E '"event": "(fallback|restored)"' "$demo/run/events.jsonl" | cut -c1-200
echo "control final digest: $want"
echo "resumed final digest: $got"
same_or_fail "$want" "$got" "the interrupted, damaged run ended bit-for-bit equal to the uninterrupted one"

# --- Act 2: the same story under a real local Slurm cluster -----------------------------------
if [[ $(id -u) -ne 0 ]]; then
  echo "== (skipping the Slurm part: the local cluster runs as root)"; exit 0
fi
echo
echo "== 5. recover demo: XID 79 on a real local Slurm cluster (4 nodes + 1 spare, the coordinator,"
echo "      one agent per node, a JAX training job on all 4 nodes), requeued; then again with a"
echo "      spare node in the job, recovered inside its allocation; what did each cost?"
# The control run and the JAX compilation cache are kept in .state/control-runs across demos.
$recover demo --out "$demo/slurm"
