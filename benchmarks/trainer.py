"""Trainer speed per compile strategy and attention path: warm-up time, steady step time, tok/s, ratios vs eager.

    .venv/bin/python benchmarks/trainer.py [--steps 60] [--cold]

Part 1 runs the real trainer (`python -m trainer`, tiny CPU config, 3 drafter threads) once per strategy and
reads its log (log_interval=1, `elapsed_s=` on every line): time to first step = warm-up (compile on the main
thread for `warmup`, compile on first use inside the workers for `naive`), steady step time = median step-to-step
interval over the second half. Part 2 times the drafter forward alone per attention path (SDPA with the
materialised mask vs flex_attention with the BlockMask, eager and compiled; forward only: flex has no CPU
backward). Numbers are one run on one machine; read the ratios, not the absolutes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CONFIG = "trainer/configs/tiny-cpu.toml"


def run_strategy(strategy: str, steps: int, cache: str, work: Path) -> dict[str, float]:
    run_dir = work / strategy
    argv = [sys.executable, "-m", "trainer", "--config", CONFIG, "--run-dir", str(run_dir),
            "--set", f"runtime.compile_strategy={strategy}", "--set", f"train.steps={steps}",
            "--set", "train.log_interval=1", "--set", "train.checkpoint_interval=0"]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "DFLASH_RUN_ID": strategy}
    env.pop("DFLASH_FAULT", None)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{strategy}: trainer exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    elapsed, tokens = [], 0
    for line in proc.stdout.splitlines():
        if line.startswith("step="):
            kv = dict(p.split("=", 1) for p in line.split())
            elapsed.append(float(kv["elapsed_s"]))
    tokens = 3 * 4 * 128  # drafters x batch x seq_len of the tiny config
    half = elapsed[len(elapsed) // 2:]
    step_s = statistics.median(b - a for a, b in zip(half, half[1:], strict=False))
    return {"first_step_s": elapsed[0], "step_ms": step_s * 1000, "tok_s": tokens / step_s, "wall_s": wall}


def attention_paths(reps: int) -> list[tuple[str, float]]:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from trainer.config import Config
    from trainer.layers import sdpa_attend
    from trainer.loss import block_inputs
    from trainer.masks import dense_mask, flex_block_mask
    from trainer.model import build_drafter
    from trainer.tiny_target import TinyTarget

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    cfg = Config()
    target = TinyTarget(cfg.target)
    drafter = build_drafter(target, cfg.drafter, len(cfg.layer_ids), "cpu")
    ids = torch.randint(0, 255, (4, 128))
    anchors = torch.sort(torch.randperm(96)[:4] + 16).values.expand(4, 4).contiguous()
    hidden = target.hidden_states(ids, cfg.layer_ids)
    block_ids, block_pos, _ = block_inputs(ids, anchors, 16, target.mask_token_id)
    dense, bmask = dense_mask(anchors, 128, 16), flex_block_mask(anchors, 128, 16)

    def flex(q, k, v, m):
        return flex_attention(q, k, v, block_mask=m)

    def fwd(attend, mask):
        return drafter(block_ids, block_pos, hidden, attend, mask)

    compiled = torch.compile(fwd)
    cases = [("sdpa eager", fwd, sdpa_attend, dense), ("flex eager", fwd, flex, bmask),
             ("sdpa compiled", compiled, sdpa_attend, dense), ("flex compiled", compiled, flex, bmask)]
    out = []
    with torch.no_grad():
        for name, fn, attend, mask in cases:
            for _ in range(3):
                fn(attend, mask)
            t0 = time.perf_counter()
            for _ in range(reps):
                fn(attend, mask)
            out.append((name, (time.perf_counter() - t0) / reps * 1000))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--cold", action="store_true", help="fresh inductor cache per strategy (first-run compile)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/trainer.md"))
    args = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        work = Path(tmp)
        shared = str(work / "cache")
        if not args.cold:  # populate the cache once so 'warm' numbers exclude first-ever kernel builds
            run_strategy("warmup", 4, shared, work / "prime")
        for strategy in ("off", "warmup", "naive"):
            cache = str(work / f"cache-{strategy}") if args.cold else shared
            rows[strategy] = run_strategy(strategy, args.steps, cache, work)
            print(strategy, rows[strategy], flush=True)
    attn = attention_paths(args.reps)
    base = rows["off"]
    lines = [
        "# trainer benchmark: tiny CPU config, 3 drafter threads, attention = SDPA (CPU training path)",
        "",
        f"Command: `.venv/bin/python benchmarks/trainer.py --steps {args.steps}{' --cold' if args.cold else ''}`; "
        f"{os.cpu_count()} CPUs, torch threads 1, inductor cache {'cold' if args.cold else 'warm'}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| strategy | time to first step s | steady step ms | tok/s | step time vs off | tok/s vs off |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['first_step_s']:.1f} | {r['step_ms']:.1f} | {r['tok_s']:.0f} | "
                     f"{r['step_ms'] / base['step_ms']:.2f} | {r['tok_s'] / base['tok_s']:.2f} |")
    ref = attn[0][1]
    lines += ["", "Drafter forward only (batch 4, 4 blocks of 16, context 128), per attention path:", "",
              "| path | ms / forward | vs sdpa eager |", "|---|---|---|"]
    lines += [f"| {name} | {ms:.2f} | {ms / ref:.2f} |" for name, ms in attn]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
