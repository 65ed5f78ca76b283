#!/usr/bin/env bash
# Demo: a training run is killed (SIGKILL, no chance to save) in the middle of its work,
# the newest checkpoint is damaged on top of that, and `recover train --resume` still ends
# bit-for-bit where an uninterrupted run ends.
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
echo "== 5. a real local Slurm cluster: 3 nodes + 1 spare, the coordinator, one agent per node"
state="$PWD/$demo/slurm"
coord="$PWD/$demo/coordinator"
$recover cluster up --nodes 3 --spares 1 --state-dir "$state" --agents
trap '$recover cluster down --state-dir "$state" >/dev/null 2>&1 || true' EXIT
eval "$($recover cluster env --state-dir "$state")"

echo "== 6. submit the training run as a requeueable job on all 3 nodes (recover sbatch)"
job=$($recover sbatch --slurm-conf "$SLURM_CONF" --nodes=3 --output="$PWD/$demo/job-%j.out" -- \
  "$PWD/$recover" train --run-dir "$PWD/$demo/slurm-run" --steps 30 --save-every 5 \
  --model mlp-small --step-sleep 0.3 --compile-cache "$PWD/$cache")
echo "job $job submitted"
until grep -q '"event": "checkpoint", [^}]*"step": 10,' "$demo/slurm-run/events.jsonl" 2>/dev/null; do sleep 0.2; done
node=$(scontrol show hostnames "$(squeue -h -j "$job" -o %N)" | head -1)
echo "== 7. job $job reached step 10 on $node: inject XID 79 there (a kernel-log line its agent reads)"
t_down=$(date +%s.%N)
$recover inject --fault xid79 --node "$node" --via kmsg --wait --state-dir "$coord"
sinfo -N -o "%N %T %E"
echo "waiting for Slurm to requeue the job and for it to finish elsewhere..."
until [[ "$(squeue -h -j "$job" -o %T 2>/dev/null)" == "" ]] || \
      grep -q '"event": "completed"' "$demo/slurm-run/events.jsonl" 2>/dev/null; do sleep 1; done
$recover incidents --state-dir "$coord" "$($recover incidents --state-dir "$coord" --json \
  | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)[-1]["id"])')"
grep -E '"event": "(started|restored|completed)"' "$demo/slurm-run/events.jsonl" \
  | sed 's/"run_config": {[^}]*}, //' | cut -c1-160
got=$(final_digest "$demo/slurm-run")
.venv/bin/python - "$demo/slurm-run/events.jsonl" "$t_down" <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
t_down = float(sys.argv[2])
# Steps the first run finished (some may follow the fault: the job runs until Slurm stops it).
before = [e for e in events if e["event"] == "step" and e.get("restart_count", 0) == 0]
restored = next(e for e in events if e["event"] == "restored")
first_step = next(e for e in events if e["event"] == "step" and e["ts"] > restored["ts"])
lost = max(e["step"] for e in before) - restored["step"]
print(f"fault injected -> restored on {restored['node']}: {restored['ts'] - t_down:.1f} s "
      f"(Slurm requeue + start + restore); -> training again: {first_step['ts'] - t_down:.1f} s; "
      f"steps recomputed: {lost}")
PY
echo "control final digest:   $want"
echo "under Slurm, node lost: $got"
same_or_fail "$want" "$got" "requeued onto another node, resumed from its newest intact checkpoint, bit-for-bit equal"
