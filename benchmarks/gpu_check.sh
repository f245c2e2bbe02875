#!/usr/bin/env bash
# GPU check for the trainer (issue 5, "the GPU path"): one prepared script for a session that gets a GPU machine.
#
#   bash benchmarks/gpu_check.sh              # on a machine with >= 1 CUDA GPU, from the repo root
#   bash benchmarks/gpu_check.sh --cpu-dry-run  # the same runs, shrunk, on the CPU: checks the script, not speed
#   bash benchmarks/gpu_check.sh --help
#
# STATUS: NOT YET RUN ON A GPU. Written in sessions without one; only --cpu-dry-run has been executed (last: with
# the issue-13 pieces below, 2026-12-01). Nothing in benchmarks/results/ is a GPU figure until this script has
# written benchmarks/results/gpu_check.md on a GPU. Not covered even then: multi-GPU target splits and micro-batch
# overlap (one GPU lent), SGLang/vLLM loading the export (no serving engine here), real Qwen3-8B weights.
#
# What it does, on cuda:0 only (target and drafter(s) share the GPU; random tiny-family targets, Markov data, no
# checkpoint or download needed), each run a real `python -m trainer` process:
#   config  tiny : the CPU demo model (hidden 64, 6 layers, vocab 256), batch 4 x seq 128, block 16
#   config  mid  : hidden 1024, 12 layers, vocab 32000 bf16 target; 3-layer drafter (fp32 weights, bf16 autocast);
#                  batch 4 x seq 1024, 32 blocks of 16
#   strategy off          eager, attention = sdpa (eager flex_attention is not a training path)
#            warmup       torch.compile warm-up on the main thread, flex_attention (attention = auto on CUDA)
#            warmup+graphs  the same + runtime.cuda_graphs = true (inductor CUDA graph trees, per thread)
#   plus per-thread CUDA streams (runtime.cuda_streams, default on) against every thread on the default stream:
#   tiny warmup with 2 drafter threads and mid warmup, each with cuda_streams = false (tok/s vs the same run with
#   streams in the "tok/s vs streams" column). No graphs run with 2 drafter threads on one GPU: the trainer turns
#   cuda_graphs off on a device that several drafter threads share (trainer/compile.py compile_mode says why), so
#   it would repeat "tiny warmup 2 threads".
# Per run: exit code, warm-up (compile) seconds, steady step ms (median over the second half), tok/s, recompiles
# after warm-up, peak CUDA memory, last loss. Writes the table to benchmarks/results/gpu_check.md and, when $OUT is
# set (the device tool's output folder), to $OUT/gpu_check.md, with every run's log in $OUT/gpu_check_logs.tar.gz
# (one archive, refreshed after each run: the tool returns at most 8 files, none with '+' in its name, and what is
# under $OUT when a run is cut off at its time limit).
# Then the issue-13 pieces (benchmarks/gpu_check_dflash.py): the chunked loss at 4 x 512 anchors x vocab 151,936
# (bf16, peak CUDA memory against the full logits), `trainer.export` loaded by the reference `dflash` package on
# the GPU (logits, lossless spec_generate, tau of its dflash_generate against trainer.eval --init-from), and
# `trainer.eval --bench` at temperature 0 / 1 and with prompt lookup, speedup measured with CUDA timing.
# Budget: each run is killed after RUN_TIMEOUT_S (default 150 s); runs still queued when TOTAL_BUDGET_S (default
# 360 s) is spent are listed as skipped; the pieces get DFLASH_PIECES_S (180 s), so the script finishes within
# ~9.5 minutes on an H200 even if compiles are slow. Needs a CUDA build of torch importable by $PYTHON (default: .venv/bin/python, else python3); the code was read
# against torch 2.13, the lent H200 image has had 2.11 (the table's header line prints the version that ran).
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
REPO=$(pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-150}
TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-360}
STEPS=${STEPS:-300}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
LOGS=$WORK/logs
mkdir -p "$LOGS" benchmarks/results
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor"  # cold cache: the first compiling run of each config pays the build

if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "gpu_check: $PY cannot import torch; install the trainer extra (pip install -e '.[trainer]') or set PYTHON" >&2
  exit 3
fi
if [ "$DRY" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch sees no CUDA device on this machine (use --cpu-dry-run to check the script on a CPU)" >&2
  exit 3
fi

# ---- configs -------------------------------------------------------------------------------------------------
cat > "$WORK/tiny.toml" <<'EOF'
[target]
vocab_size = 256
hidden_size = 64
num_layers = 6
num_heads = 4
num_kv_heads = 2
intermediate_size = 128
num_captured = 3
[drafter]
num_layers = 2
block_size = 16
num_heads = 4
num_kv_heads = 2
intermediate_size = 128
[train]
batch_size = 4
seq_len = 128
num_anchors = 4
lr = 1e-2
min_lr = 1e-3
warmup_steps = 10
log_interval = 10
checkpoint_interval = 0
EOF
cat > "$WORK/mid.toml" <<'EOF'
[target]
dtype = "bfloat16"          # the GPU path's precision: bf16 target, fp32 drafter weights under autocast
vocab_size = 32000
hidden_size = 1024
num_layers = 12
num_heads = 16
num_kv_heads = 8
intermediate_size = 2816
num_captured = 3
[drafter]
num_layers = 3
block_size = 16
num_heads = 16
num_kv_heads = 8
intermediate_size = 2816
[data]
prompt_len = 128
[train]
batch_size = 4
seq_len = 1024
num_anchors = 32
lr = 6e-4
min_lr = 6e-5
warmup_steps = 20
log_interval = 10
checkpoint_interval = 0
EOF

if [ "$DRY" = 1 ]; then
  DEV=cpu
  THREADS=1
  STEPS=${DRY_STEPS:-20}
  LOG_EVERY=2
  # shrink mid so the CPU finishes; attention auto = sdpa on the CPU, cuda_graphs is ignored off CUDA
  SHRINK=(--set train.seq_len=192 --set train.num_anchors=4 --set train.batch_size=1 --set data.prompt_len=32
          --set target.num_layers=4 --set drafter.num_layers=1)
else
  DEV=cuda:0
  THREADS=4
  LOG_EVERY=10
  SHRINK=()
fi

# name | config | drafters | extra overrides
RUNS=(
  "tiny off|tiny|1|--set runtime.compile_strategy=off --set runtime.attention=sdpa"
  "tiny warmup|tiny|1|--set runtime.compile_strategy=warmup"
  "tiny warmup+graphs|tiny|1|--set runtime.compile_strategy=warmup --set runtime.cuda_graphs=true"
  "mid off|mid|1|--set runtime.compile_strategy=off --set runtime.attention=sdpa"
  "mid warmup|mid|1|--set runtime.compile_strategy=warmup"
  "mid warmup+graphs|mid|1|--set runtime.compile_strategy=warmup --set runtime.cuda_graphs=true"
  "tiny warmup 2 threads|tiny|2|--set runtime.compile_strategy=warmup"
  "tiny warmup 2 threads default stream|tiny|2|--set runtime.compile_strategy=warmup --set runtime.cuda_streams=false"
  "mid warmup default stream|mid|1|--set runtime.compile_strategy=warmup --set runtime.cuda_streams=false"
)

START=$(date +%s)
RESULTS="$WORK/results.tsv"
: > "$RESULTS"
i=0
for spec in "${RUNS[@]}"; do
  IFS='|' read -r name cfg ndraft extra <<< "$spec"
  i=$((i + 1))
  log="$LOGS/$(printf '%02d' "$i")-$(printf '%s' "$name" | tr -c 'A-Za-z0-9._-' '_').log"
  run_dir="$WORK/run-$i"
  used=$(( $(date +%s) - START ))
  if [ "$used" -ge "$TOTAL_BUDGET_S" ]; then
    printf '%s\t%s\tskipped\t%s\t%s\n' "$name" "$cfg" "$log" "$run_dir" >> "$RESULTS"
    continue
  fi
  left=$(( TOTAL_BUDGET_S - used + 30 ))
  limit=$(( RUN_TIMEOUT_S < left ? RUN_TIMEOUT_S : left ))
  drafters=$("$PY" -c "import sys; print([sys.argv[1]] * int(sys.argv[2]))" "$DEV" "$ndraft")
  # shellcheck disable=SC2086  # $extra is a list of --set words
  cmd=("$PY" -m trainer --config "$WORK/$cfg.toml" --run-dir "$run_dir" --set "devices.target=['$DEV']"
       --set "devices.drafters=$drafters" --set "train.steps=$STEPS" --set "train.log_interval=$LOG_EVERY" --set runtime.heartbeat_interval_s=1.0
       --set "runtime.torch_threads=$THREADS" $extra)
  if [ "$cfg" = mid ] && [ "${#SHRINK[@]}" -gt 0 ]; then cmd+=("${SHRINK[@]}"); fi
  echo "[$i/${#RUNS[@]}] $name (limit ${limit}s): ${cmd[*]}" | tee "$log" >&2
  t0=$(date +%s%N)
  timeout -k 10 "$limit" "${cmd[@]}" >> "$log" 2>&1
  rc=$?
  wall=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$cfg" "$rc" "$log" "$run_dir" "$wall" >> "$RESULTS"
  echo "    rc=$rc wall=$((wall / 1000))s" >&2
  if [ -n "${OUT:-}" ]; then tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$WORK" logs results.tsv; fi
done

# ---- table ---------------------------------------------------------------------------------------------------
"$PY" - "$RESULTS" "$DEV" "$STEPS" "$DRY" "${OUT:-}" "$LOG_EVERY" > "$WORK/gpu_check.md" <<'EOF'
import json, statistics, subprocess, sys, time
from pathlib import Path

results, dev, steps, dry, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
every = int(sys.argv[6])
import torch

gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU dry run)"
tokens = {"tiny": 4 * 128, "mid": 4 * 1024}
if dry:
    tokens["mid"] = 1 * 192
title = "CPU DRY RUN of benchmarks/gpu_check.sh: not GPU figures" if dry else f"trainer on one GPU: {gpu}"
print(f"# {title}\n")
print(f"`bash benchmarks/gpu_check.sh{' --cpu-dry-run' if dry else ''}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
      f"torch {torch.__version__}, device {dev}, {steps} steps per run, cold inductor cache at the first compiling "
      "run of each config (later runs of that config reuse it). Step time = median log-interval time over the "
      f"second half / {every} steps; tok/s = drafter tokens (threads x batch x seq_len) per second. Target and drafters "
      "share the device.\n")
print("| run | exit | warm-up s | step ms | tok/s | tok/s vs off | tok/s vs streams | recompiles | peak CUDA MiB "
      "| last loss | wall s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
base, by_name = {}, {}
for row in Path(results).read_text().splitlines():
    name, cfg, rc, log, run_dir, *rest = row.split("\t")
    if rc == "skipped":
        print(f"| {name} | skipped (time budget) | | | | | | | | | |")
        continue
    text = Path(log).read_text(errors="replace")
    lines = text.splitlines()
    steps_kv = [dict(p.split("=", 1) for p in ln.split() if "=" in p) for ln in lines if ln.startswith("step=")]
    warm = next((ln.split("compile_s=")[1].split()[0] for ln in lines if ln.startswith("warmup done")), "-")
    threads = 2 if "2 threads" in name else 1
    step_ms = tok_s = ratio = vs_streams = "-"
    if len(steps_kv) >= 4:
        el = [float(kv["elapsed_s"]) for kv in steps_kv]
        half = el[len(el) // 2:]
        per = statistics.median(b - a for a, b in zip(half, half[1:])) / every
        step_ms, tps = f"{per * 1000:.1f}", threads * tokens[cfg] / per
        tok_s = f"{tps:.0f}"
        if name.endswith(" off"):
            base[cfg] = tps
        ratio = f"{tps / base[cfg]:.2f}" if cfg in base else "-"
        by_name[name] = tps
        with_streams = by_name.get(name.removesuffix(" default stream"))
        if name.endswith(" default stream") and with_streams:
            vs_streams = f"{tps / with_streams:.2f}"
    rec = steps_kv[-1].get("recompiles", "-") if steps_kv else "-"
    loss = steps_kv[-1].get("loss", "-") if steps_kv else "-"
    peak = "-"
    hb = Path(run_dir) / "heartbeat.json"
    if hb.exists():
        devs = json.loads(hb.read_text()).get("devices", [])
        vals = [d.get("max_memory_allocated_mib") for d in devs if d.get("max_memory_allocated_mib") is not None]
        peak = f"{max(vals):.0f}" if vals else "-"
    status = rc if rc == "0" else f"{rc} ({'timeout' if rc in ('124', '137') else 'FAILED'})"
    wall = f"{int(rest[0]) / 1000:.0f}" if rest and rest[0] else "-"
    print(f"| {name} | {status} | {warm} | {step_ms} | {tok_s} | {ratio} | {vs_streams} | {rec} | {peak} | {loss} "
          f"| {wall} |")
    if rc not in ("0",):
        err = [ln for ln in lines if "Error" in ln or "error:" in ln][-3:]
        for e in err:
            print(f"|   | `{e.strip()[:150]}` | | | | | | | | | |")
print()
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.TimeoutExpired):
    smi = "nvidia-smi not available"
print(f"nvidia-smi: {smi}\n")
print("Logs: " + ("gpu_check_logs.tar.gz in $OUT of the device run" if out else "the work directory (temporary)")
      + ".")
EOF
rc=$?
# ---- the issue-13 pieces: chunked loss at the recipe's scale, export + the reference dflash package, server-free
# evaluation with real device timing (benchmarks/gpu_check_dflash.py; each piece reports its own failure and the rest
# go on). Bounded by DFLASH_PIECES_S (default 180 s).
small=(); [ "$DRY" = 1 ] && small=(--small)
echo "[pieces] benchmarks/gpu_check_dflash.py --device $DEV ${small[*]}" >&2
timeout -k 10 "${DFLASH_PIECES_S:-180}" "$PY" benchmarks/gpu_check_dflash.py --device "$DEV" "${small[@]}" \
  --out "$WORK/pieces.md" > "$LOGS/pieces.log" 2>&1
prc=$?
if [ -s "$WORK/pieces.md" ]; then cat "$WORK/pieces.md" >> "$WORK/gpu_check.md"; fi
[ "$prc" -ne 0 ] && printf '\nissue-13 pieces: exit %s (124 = cut off at DFLASH_PIECES_S); see logs/pieces.log\n' "$prc" \
  >> "$WORK/gpu_check.md"
if [ -n "${OUT:-}" ]; then tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$WORK" logs results.tsv; fi
cat "$WORK/gpu_check.md"
if [ "$rc" -ne 0 ]; then echo "gpu_check: table step failed (rc=$rc); raw results in $RESULTS" >&2; exit 1; fi
dest=benchmarks/results/gpu_check.md
[ "$DRY" = 1 ] && dest=benchmarks/results/gpu_check_cpu_dry_run.md
cp "$WORK/gpu_check.md" "$dest"
[ -n "${OUT:-}" ] && cp "$WORK/gpu_check.md" "$OUT/gpu_check.md"
echo "saved $dest${OUT:+ and \$OUT/gpu_check.md}" >&2
