#!/usr/bin/env bash
# GPU check for the trainer, sized for a 15-minute GPU window with room to rerun: at most ~6 minutes, the most
# valuable figure first, every figure written to $OUT the moment it is made (a run cut off keeps what ran).
#
#   bash benchmarks/gpu_check.sh                # on a machine with >= 1 CUDA GPU, from the repo root
#   bash benchmarks/gpu_check.sh --cpu-dry-run  # every step on tiny shapes on the CPU: checks the script, not speed
#   bash benchmarks/gpu_check.sh --help
#
# STATUS: NOT YET RUN ON A GPU. Only --cpu-dry-run has been executed (tests/trainer/test_gpu_check.py runs it).
# Nothing in benchmarks/results/ is a GPU figure until this script has written benchmarks/results/gpu_check.md on a
# GPU.
#
# Steps, in order (each a real process; one GPU, cuda:0; random weights, Markov data, nothing downloaded):
#   0 env        torch / CUDA / driver / transformers versions, and the CUDA-graph safety probe of
#                trainer/graph_probe.py (captures a compiled fwd+bwd from a thread; verdict and pool MiB)
#   1 recipe, graphs off   the recipe's shapes (hidden 4096, 32 x 128 heads / 8 kv, intermediate 12288, vocab
#                151,936, seq_len 3072, 512 anchors x 16), bf16 target of 4 layers and a 2-layer drafter (layer
#                counts scaled so one GPU holds both), batch 2, torch.compile warm-up, 20 steps: step time, tok/s,
#                peak CUDA memory
#   2 recipe, graphs on    the same with runtime.cuda_graphs = true, warm inductor cache from step 1 (the probe
#                decides whether graphs are really used; the log line says which)
#   3 two drafter threads  the threads layout with 2 drafters on the one GPU (batch 1 each: the same global batch)
#   4 process layout       torchrun, 2 ranks x (target + drafter) on the one GPU (DFLASH_RANKS_SHARE_DEVICES=1;
#                gloo, since NCCL refuses two ranks on one device), DDP bf16 buckets, batch 1 each
#   5 bf16 HF eval         a random Qwen3 HF checkpoint (trainer.hf_tiny) loaded in bf16, `trainer.eval` at
#                temperature 0: lossless verdict and the near-tie count (first differences under 2 bf16 ulps)
#   6 pieces     benchmarks/gpu_check_dflash.py (chunked loss at recipe scale, export + reference, bench eval),
#                only with the budget left
# Budget: TOTAL_BUDGET_S (default 330 s) for steps 1-6, each run killed after RUN_TIMEOUT_S (default 110 s);
# steps not started within the budget are listed as skipped. $OUT/gpu_check.md is rewritten after every step,
# $OUT/env.txt after step 0, $OUT/gpu_check_logs.tar.gz (every log) after every step.
set -u -o pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
DRY=0
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --cpu-dry-run) DRY=1 ;;
  "") ;;
  *) echo "gpu_check: unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-110}
TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-330}
STEPS=${STEPS:-20}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
LOGS=$WORK/logs
DEST=${OUT:-$WORK/out}
mkdir -p "$LOGS" "$DEST" benchmarks/results
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor"  # cold at step 1, warm for step 2 onwards

if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "gpu_check: $PY cannot import torch; install the trainer extra (pip install -e '.[trainer]') or set PYTHON" >&2
  exit 3
fi
if [ "$DRY" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch sees no CUDA device on this machine (use --cpu-dry-run to check the script on a CPU)" >&2
  exit 3
fi

if [ "$DRY" = 1 ]; then
  DEV=cpu; THREADS=1; COMPILE=off   # a CPU has no CUDA graphs; compiling here takes minutes and proves nothing
  SHAPE=(--set target.hidden_size=64 --set target.num_heads=4 --set target.num_kv_heads=2
         --set target.intermediate_size=128 --set target.vocab_size=512 --set drafter.num_heads=4
         --set drafter.num_kv_heads=2 --set drafter.head_dim=16 --set drafter.intermediate_size=128
         --set train.seq_len=128 --set train.num_anchors=4 --set data.prompt_len=16)
  EVAL_TOKENS=16
else
  DEV=cuda:0; THREADS=4; COMPILE=warmup
  SHAPE=()
  EVAL_TOKENS=96
fi

cat > "$WORK/recipe.toml" <<'EOF'
# The seed recipe's shapes (trainer/configs/seed-8gpu.toml) with fewer layers: Markov data, random weights.
[target]
dtype = "bfloat16"
vocab_size = 151936
hidden_size = 4096
num_layers = 4
num_heads = 32
num_kv_heads = 8
intermediate_size = 12288
num_captured = 3
[drafter]
num_layers = 2
block_size = 16
num_heads = 32
num_kv_heads = 8
head_dim = 128
intermediate_size = 12288
[data]
prompt_len = 256
[train]
batch_size = 2
seq_len = 3072
num_anchors = 512
loss_chunk = 2048
lr = 6e-4
min_lr = 0.0
warmup_steps = 5
log_interval = 1
checkpoint_interval = 0
[runtime]
heartbeat_interval_s = 1.0
EOF

# ---- 0: environment and the graph-safety probe ------------------------------------------------------------------
"$PY" - "$DEV" > "$DEST/env.txt" 2>&1 <<'EOF'
import platform, subprocess, sys
import torch
from trainer.graph_probe import probe

dev = sys.argv[1]
print(f"python {platform.python_version()}  torch {torch.__version__}  cuda {torch.version.cuda}  "
      f"cudnn {torch.backends.cudnn.version() if torch.cuda.is_available() else None}")
try:
    import transformers
    print(f"transformers {transformers.__version__}")
except ImportError:
    print("transformers not installed")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"gpu {p.name}  {p.total_memory / 2**30:.1f} GiB  sm {p.major}.{p.minor}  count {torch.cuda.device_count()}")
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pcie.link.gen.current",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.TimeoutExpired):
    smi = "not available"
print(f"nvidia-smi {smi}")
print(probe(dev).line(dev))
EOF
echo "[0] env: $(tr '\n' ';' < "$DEST/env.txt")" >&2

# ---- 1-6 -------------------------------------------------------------------------------------------------------
# name | kind | extra words
RUNS=(
  "recipe, graphs off|train|--set runtime.compile_strategy=$COMPILE"
  "recipe, graphs on (warm cache)|train|--set runtime.compile_strategy=$COMPILE --set runtime.cuda_graphs=true"
  "2 drafter threads, one GPU|train2|--set runtime.compile_strategy=$COMPILE --set train.batch_size=1"
  "process layout, 2 ranks, one GPU|ranks|--set runtime.compile_strategy=$COMPILE --set train.batch_size=1"
  "bf16 HF target eval, T=0|eval|"
  "pieces (gpu_check_dflash.py)|pieces|"
)
RESULTS="$WORK/results.tsv"
: > "$RESULTS"

table() {
  "$PY" - "$RESULTS" "$DEV" "$STEPS" "$DRY" "$DEST/env.txt" > "$DEST/gpu_check.md" <<'EOF'
import json, statistics, sys, time
from pathlib import Path

results, dev, steps, dry, env = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
title = "CPU DRY RUN of benchmarks/gpu_check.sh: tiny shapes, not GPU figures" if dry else "trainer on one GPU"
print(f"# {title}\n\n`bash benchmarks/gpu_check.sh{' --cpu-dry-run' if dry else ''}`, "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, device {dev}, {steps} steps per training run.\n")
print("```\n" + Path(env).read_text().strip() + "\n```\n")
print("Step time = median step-to-step interval over the second half; tok/s = drafter tokens (replicas x batch x "
      "seq_len) per second; peak = the largest max_memory_allocated of any heartbeat (all ranks).\n")
print("| step | exit | warm-up s | step ms | tok/s | peak CUDA MiB | last loss | note | wall s |")
print("|---|---|---|---|---|---|---|---|---|")
for row in Path(results).read_text().splitlines():
    name, kind, rc, log, run_dir, wall = (row.split("\t") + [""] * 6)[:6]
    if rc == "skipped":
        print(f"| {name} | skipped (time budget) | | | | | | | |")
        continue
    lines = Path(log).read_text(errors="replace").splitlines() if Path(log).exists() else []
    status = rc if rc == "0" else f"{rc} ({'timeout' if rc in ('124', '137') else 'FAILED'})"
    wall_s = f"{int(wall) / 1000:.0f}" if wall else "-"
    if kind == "eval":
        doc = json.loads(Path(run_dir, "eval.json").read_text()) if Path(run_dir, "eval.json").exists() else {}
        note = (f"lossless {doc.get('lossless_count')}/{doc.get('checked')}, near-ties {doc.get('near_ties')}, "
                f"verdict {'pass' if doc.get('lossless') else 'FAIL'}, tau {doc.get('tau')}") if doc else "no report"
        print(f"| {name} | {status} | | | | | | {note} | {wall_s} |")
        continue
    if kind == "pieces":
        print(f"| {name} | {status} | | | | | | below | {wall_s} |")
        continue
    kv = [dict(p.split("=", 1) for p in ln.split() if "=" in p) for ln in lines if ln.startswith("step=")]
    warm = next((ln.split("compile_s=")[1].split()[0] for ln in lines if ln.startswith("warmup done")), "-")
    step_ms = tok_s = "-"
    if len(kv) >= 4:
        el = [float(k["elapsed_s"]) for k in kv]
        half = el[len(el) // 2:]
        per = statistics.median(b - a for a, b in zip(half, half[1:]))
        step_ms = f"{per * 1000:.1f}"
        tokens = next((int(ln.split("tokens_per_step=")[1].split()[0]) for ln in lines if "tokens_per_step=" in ln), 0)
        tok_s = f"{tokens / per:.0f}" if tokens else "-"
    peaks = []
    for hb in Path(run_dir).glob("**/heartbeat.json"):
        for d in json.loads(hb.read_text()).get("devices", []):
            if d.get("max_memory_allocated_mib") is not None:
                peaks.append(d["max_memory_allocated_mib"])
    peak = f"{max(peaks):.0f}" if peaks else "-"
    loss = kv[-1].get("loss", "-") if kv else "-"
    notes = [ln.split("verdict=")[1].split()[0] for ln in lines if "cuda_graphs_probe" in ln]
    notes += ["graphs turned off" for ln in lines if ln.startswith("cuda_graphs: off")]
    note = ("probe " + ", ".join(notes)) if notes else ""
    if rc != "0":
        err = [ln.strip()[:120] for ln in lines if "Error" in ln or "error:" in ln][-1:]
        note += (" " + err[0].replace("|", "/")) if err else ""
    print(f"| {name} | {status} | {warm} | {step_ms} | {tok_s} | {peak} | {loss} | {note} | {wall_s} |")
pieces = Path(results).with_name("pieces.md")
if pieces.exists():
    print("\n" + pieces.read_text())
EOF
  tar -czf "$DEST/gpu_check_logs.tar.gz" -C "$WORK" logs results.tsv 2>/dev/null
}

START=$(date +%s)
i=0
for spec in "${RUNS[@]}"; do
  IFS='|' read -r name kind extra <<< "$spec"
  i=$((i + 1))
  log="$LOGS/$i-$kind.log"
  run_dir="$WORK/run-$i"
  used=$(( $(date +%s) - START ))
  if [ "$used" -ge "$TOTAL_BUDGET_S" ]; then
    printf '%s\t%s\tskipped\t%s\t%s\t\n' "$name" "$kind" "$log" "$run_dir" >> "$RESULTS"
    table
    continue
  fi
  left=$(( TOTAL_BUDGET_S - used ))
  limit=$(( RUN_TIMEOUT_S < left ? RUN_TIMEOUT_S : left ))
  mkdir -p "$run_dir"
  env_extra=()
  # shellcheck disable=SC2206  # $extra is a list of --set words
  words=($extra)
  common=(--config "$WORK/recipe.toml" --run-dir "$run_dir" --set "devices.target=['$DEV']"
          --set "train.steps=$STEPS" --set "runtime.torch_threads=$THREADS" "${SHAPE[@]}" "${words[@]}")
  case "$kind" in
    train)  cmd=("$PY" -m trainer "${common[@]}" --set "devices.drafters=['$DEV']") ;;
    train2) cmd=("$PY" -m trainer "${common[@]}" --set "devices.drafters=['$DEV','$DEV']") ;;
    ranks)  cmd=("$PY" -m torch.distributed.run --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1
                 --master-port "$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
                 -m trainer "${common[@]}" --set "devices.drafters=['$DEV']" --set runtime.layout=processes
                 --set runtime.dist_backend=gloo)
            env_extra=(DFLASH_RANKS_SHARE_DEVICES=1) ;;
    eval)   "$PY" -m trainer.hf_tiny --out "$WORK/hf-qwen3" > "$LOGS/hf_tiny.log" 2>&1
            cmd=("$PY" -m trainer.eval --config trainer/configs/tiny-hf-cpu.toml --untrained --target "$WORK/hf-qwen3"
                 --set data.kind=markov --set target.dtype=bfloat16 --set "devices.target=['$DEV']" --set "devices.drafters=['$DEV']"
                 --prompts trainer/prompts/eval.jsonl --limit 4 --max-new-tokens "$EVAL_TOKENS" --temperature 0
                 --json --out "$run_dir/eval.json") ;;
    pieces) small=(); [ "$DRY" = 1 ] && small=(--small)
            cmd=("$PY" benchmarks/gpu_check_dflash.py --device "$DEV" "${small[@]}" --out "$WORK/pieces.md") ;;
  esac
  echo "[$i/${#RUNS[@]}] $name (limit ${limit}s): ${cmd[*]}" | tee "$log" >&2
  t0=$(date +%s%N)
  env "${env_extra[@]}" timeout -k 10 "$limit" "${cmd[@]}" >> "$log" 2>&1
  rc=$?
  wall=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$kind" "$rc" "$log" "$run_dir" "$wall" >> "$RESULTS"
  echo "    rc=$rc wall=$((wall / 1000))s" >&2
  table
done

cat "$DEST/gpu_check.md"
dest=benchmarks/results/gpu_check.md
[ "$DRY" = 1 ] && dest=benchmarks/results/gpu_check_cpu_dry_run.md
if [ "${GPU_CHECK_NO_SAVE:-0}" != 1 ]; then  # tests set it: the repository's results stay as they are
  cp "$DEST/gpu_check.md" "$dest"
  echo "saved $dest${OUT:+ and \$OUT/gpu_check.md}" >&2
fi
failed=$(awk -F'\t' '$3 != "0" && $3 != "skipped" { n++ } END { print n + 0 }' "$RESULTS")
[ "$failed" -eq 0 ] || { echo "gpu_check: $failed step(s) failed (see the table)" >&2; exit 1; }
