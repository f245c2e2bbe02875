"""Tokens/s per training layout and GPU, on paper, beside the two layouts measured on this machine's CPU.

    .venv/bin/python benchmarks/layout_model.py [--steps 30] [--no-measure] [--out benchmarks/results/layout_model.md]

Part 1 (the plan until a GPU measures it): SpecForge's Qwen3-8B DFlash recipe (seq_len 3072, 512 anchors x 16,
batch 4 per drafter, drafter 5 layers hidden 4096 / 32 heads x 128 / 8 kv heads / intermediate 12288, vocab 151,936)
on one 8-GPU host, three layouts:
  threads 5+3   the seed: target split over GPUs 0-4 (one process), 3 drafter threads on GPUs 5-7, fp32 gradient
                mean through the lowest drafter GPU after the backward (not overlapped), a host sync per step
  threads 3+5   3 whole target replicas feeding 5 drafter GPUs (the same code path, another device list)
  processes 8   8 torchrun ranks, each GPU a target replica + a drafter, DDP bf16 ring all-reduce overlapped with
                the backward (runtime.layout = "processes", seed-8gpu.toml)
Every figure below is computed from the constants in this file; each constant says where it comes from. None is a
GPU measurement: the GPU path of this project is unmeasured (no GPU in this session).

Part 2 (measured): the real trainer on this CPU, tiny config, compile off, the same global batch: one process with
2 drafter threads vs torchrun 2 ranks x (target + drafter) (gloo, bf16 buckets): tok/s and median step time from the
trainer's own log lines, in the same run. A CPU has no idle target GPUs to win back; it shows the process layout's
overhead (two processes, DDP, gloo) against the threads', nothing about GPUs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# ---- the recipe (trainer/configs/seed-8gpu.toml; SpecForge a6b6b023 examples/configs/qwen3-8b-dflash-online.yaml,
# configs/qwen3-8b-dflash.json) --------------------------------------------------------------------------------
SEQ, ANCHORS, BLOCK, BATCH = 3072, 512, 16, 4
H, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, D_LAYERS, CAPTURED = 4096, 32, 8, 128, 12288, 151_936, 5, 5
# Qwen3-8B (its config.json: 36 layers, hidden 4096, intermediate 12288, 32 q / 8 kv heads of 128; 8.19e9 params of
# which 2 x 151,936 x 4,096 = 1.24e9 are embedding + LM head); the trainer runs it up to the last captured layer 33
T_LAYERS, T_RUN_LAYERS = 36, 34

# ---- hardware (NVIDIA datasheets) -----------------------------------------------------------------------------
# H100 SXM5: 989 TFLOPS dense BF16 (1,979 with sparsity), NVLink 4 900 GB/s total = 450 GB/s each direction;
#   https://www.nvidia.com/en-us/data-center/h100/  (datasheet table, "BF16 Tensor Core", "Interconnect")
# H200 SXM: the same GH100 compute (989 TFLOPS dense BF16), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s;
#   https://www.nvidia.com/en-us/data-center/h200/
# PCIe only (no NVLink, and no P2P: common under VM passthrough): PCIe Gen5 x16 = 64 GB/s each direction on
#   paper; GPU-to-GPU copies bounce through host memory, taken here as 25 GB/s effective (assumption: about
#   40 % of the link, two hops; NCCL without P2P uses host-staged SHM transport).
GPUS = {"H100 80GB": 989e12, "H200 141GB": 989e12}
LINKS = {"NVLink": 450e9 * 0.7, "PCIe-only": 25e9}  # NVLink at 70 % of the per-direction rate (assumption)
# ---- efficiency (assumptions, to be replaced by gpu_check.sh's figures) ---------------------------------------
MFU_TRAIN = 0.45   # drafter forward+backward: large bf16 matmuls + flex attention
MFU_INFER = 0.60   # target forward: bigger matmuls, no backward
DDP_OVERLAP = 0.8  # share of the DDP all-reduce hidden under the backward (bucketed; the last buckets are exposed)
HOST_SYNC_S = 0.005  # the seed's per-step `.tolist()`: drains the stream once a step (gone since issue 27: the
#                      threads layout reads its stats a step late on CUDA; kept, so the threads rows stay the seed's)


@dataclass
class Work:
    drafter_flops: float  # one drafter's forward+backward per step (its BATCH sequences)
    lm_head_flops: float
    target_flops_per_seq: float
    grad_bytes_fp32: float
    grad_bytes_bf16: float


def work() -> Work:
    """FLOPs as 2 x multiply-adds; backward = 2 x forward for trained weights, 1 x (input grads only) for frozen."""
    q_rows, kv_rows = ANCHORS * BLOCK, SEQ + ANCHORS * BLOCK
    kv = KV_HEADS * HEAD_DIM
    per_layer_fwd = (2 * q_rows * H * HEADS * HEAD_DIM * 2  # q_proj, o_proj
                     + 2 * kv_rows * H * kv * 2  # k_proj, v_proj over [context ; blocks]
                     + 2 * q_rows * H * INTER * 3  # SwiGLU
                     + 4 * q_rows * (SEQ / 2 + BLOCK) * HEAD_DIM * HEADS)  # attention: mean context ~ half
    fc_fwd = 2 * SEQ * CAPTURED * H * H
    lm_fwd = 2 * q_rows * H * VOCAB
    per_seq = 3 * (D_LAYERS * per_layer_fwd + fc_fwd) + 3 * lm_fwd  # LM head: fwd, recompute (chunked), dgrad
    params = D_LAYERS * (2 * H * HEADS * HEAD_DIM + 2 * H * kv + 3 * H * INTER) + CAPTURED * H * H
    t_params = 8.19e9 - 2 * VOCAB * H
    target_per_seq = 2 * t_params * (T_RUN_LAYERS / T_LAYERS) * SEQ + 4 * SEQ * SEQ / 2 * 4096 * T_RUN_LAYERS
    return Work(BATCH * per_seq, BATCH * 3 * lm_fwd, target_per_seq, 4 * params, 2 * params)


def layouts(w: Work, peak: float, link: float) -> list[tuple[str, float, float, str]]:
    """(layout, step seconds, tokens/s, what sets the pace)."""
    drafter_s = w.drafter_flops / (peak * MFU_TRAIN)
    rows = []
    for name, n_target, n_drafter in (("threads 5+3", 5, 3), ("threads 3+5", 3, 5)):
        seqs = n_drafter * BATCH
        # 5+3: one target split layer-wise (micro-batches keep its GPUs busy at best); 3+5: whole replicas, each
        # serving its share of the drafters. Either way the target's work spreads over n_target GPUs.
        target_s = seqs * w.target_flops_per_seq / (peak * MFU_INFER) / n_target
        # fp32 mean through the lowest drafter GPU: (n-1) gradients in, the mean out to (n-1), one link at a time
        reduce_s = 2 * (n_drafter - 1) * w.grad_bytes_fp32 / link + HOST_SYNC_S
        step = max(drafter_s, target_s) + reduce_s
        pace = "drafters" if drafter_s >= target_s else "target"
        rows.append((name, step, seqs * SEQ / step, f"{pace} + {reduce_s:.2f}s reduce"))
    n = 8
    target_s = BATCH * w.target_flops_per_seq / (peak * MFU_INFER)
    ring_s = 2 * (n - 1) / n * w.grad_bytes_bf16 / link
    step = target_s + drafter_s + ring_s * (1 - DDP_OVERLAP)
    rows.append(("processes 8", step, n * BATCH * SEQ / step, f"target+drafter per GPU + {ring_s:.2f}s ring "
                 f"({1 - DDP_OVERLAP:.0%} exposed)"))
    return rows


def paper_table() -> list[str]:
    w = work()
    out = [f"Per step and drafter: {w.drafter_flops / 1e12:.0f} TFLOPs ({w.lm_head_flops / 1e12:.0f} of them the "
           f"chunked LM head); target forward {w.target_flops_per_seq / 1e12:.1f} TFLOPs per sequence; drafter "
           f"gradients {w.grad_bytes_fp32 / 1e9:.1f} GB fp32 / {w.grad_bytes_bf16 / 1e9:.1f} GB bf16.", "",
           f"Assumed: MFU {MFU_TRAIN} training, {MFU_INFER} target inference; NVLink at 70 % of 450 GB/s, "
           f"PCIe-only 25 GB/s effective; DDP hides {DDP_OVERLAP:.0%} of its all-reduce.", "",
           "H100 and H200 share GH100's dense BF16 peak: in this compute-bound model they differ only in memory "
           "(H200's 141 GB leaves room for batch 8 per rank, seed-8gpu.toml's estimate), which it does not turn "
           "into speed.", "",
           "| GPU | interconnect | layout | step s (model) | tokens/s (model) | x threads 5+3 | pace |",
           "|---|---|---|---|---|---|---|"]
    for gpu, peak in GPUS.items():
        for link_name, link in LINKS.items():
            rows = layouts(w, peak, link)
            base = rows[0][2]
            for name, step, tok_s, pace in rows:
                out.append(f"| {gpu} | {link_name} | {name} | {step:.2f} | {tok_s:,.0f} | {tok_s / base:.2f} | "
                           f"{pace} |")
    return out


# ---- part 2: measured on this CPU -----------------------------------------------------------------------------
def _trainer(work_dir: Path, name: str, launcher: list[str], extra: list[str], steps: int) -> dict[str, float]:
    run = work_dir / name
    cmd = [sys.executable, *launcher, "-m", "trainer", "--config", "trainer/configs/tiny-cpu.toml", "--run-dir",
           str(run), "--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set",
           "train.seq_len=64", "--set", "train.log_interval=1", "--set", f"train.steps={steps}", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    rows = [dict(p.split("=", 1) for p in ln.split()) for ln in proc.stdout.splitlines() if ln.startswith("step=")]
    elapsed = [float(r["elapsed_s"]) for r in rows]
    half = elapsed[len(elapsed) // 2:]
    step_s = statistics.median(b - a for a, b in zip(half, half[1:], strict=False))
    tokens_per_step = 4 * 64  # 2 replicas x batch 2 x seq 64, both layouts
    return {"step_s": step_s, "tok_s": tokens_per_step / step_s}


def measured_table(steps: int) -> list[str]:
    sys.path.insert(0, str(REPO / "tests"))
    from harness.sshd import free_port

    with tempfile.TemporaryDirectory() as tmp:
        threads = _trainer(Path(tmp), "threads", [], ["--set", 'devices.drafters=["cpu","cpu"]'], steps)
        procs = _trainer(Path(tmp), "processes", ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                                                  "2", "--master-addr", "127.0.0.1", "--master-port",
                                                  str(free_port())],
                         ["--set", 'devices.drafters=["cpu"]', "--set", "runtime.layout=processes"], steps)
    return ["| layout (CPU, tiny, 4 x 64 tokens a step) | median step s | tokens/s | x threads |", "|---|---|---|---|",
            f"| threads: 1 process, 2 drafter threads | {threads['step_s']:.4f} | {threads['tok_s']:,.0f} | 1.00 |",
            f"| processes: 2 ranks x (target + drafter), DDP bf16 | {procs['step_s']:.4f} | {procs['tok_s']:,.0f} | "
            f"{procs['tok_s'] / threads['tok_s']:.2f} |"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--no-measure", action="store_true", help="only the paper model")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "layout_model.md"))
    args = p.parse_args()
    lines = ["# Training layouts: tokens/s on paper (GPU, unmeasured) and measured on this CPU", "",
             "`.venv/bin/python benchmarks/layout_model.py" + (f" --steps {args.steps}" if args.steps != 30 else "")
             + "`", "", "## Model (no GPU has measured these; constants and sources in the script)", "",
             *paper_table()]
    if not args.no_measure:
        lines += ["", f"## Measured on this machine's CPU ({os.cpu_count()} cores, shared), {args.steps} steps", "",
                  *measured_table(args.steps)]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
