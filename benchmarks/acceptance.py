"""Acceptance length tau before and after training, on a tiny Hugging Face target, end to end on the CPU.

    .venv/bin/python benchmarks/acceptance.py [--steps 300] [--work DIR]

Runs the real commands in order: write a tiny random Qwen3 checkpoint (`python -m trainer.hf_tiny`), let it
answer the 240 topic prompts (`python -m trainer.datagen generate`, greedy, 96 new tokens), evaluate the step-0
drafter, train (`python -m trainer.hf_train`, 2 drafter threads), evaluate again. tau is measured by real block
speculative decoding (`python -m trainer.eval`) on the held-out prompts of trainer/prompts/eval.jsonl and on
the first 8 training prompts, with the lossless check (output == greedy decoding) on every prompt. Prints a
table and writes benchmarks/results/acceptance.md (+ .json). CPU only; GPU figures are not claimed here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def sh(*args: str, timeout: float = 1800) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([PY, "-m", *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


def tau(ckpt: Path, prompts: str, untrained: bool, limit: int, max_new: int) -> dict:
    args = ["trainer.eval", "--checkpoint", str(ckpt), "--prompts", prompts, "--json",
            "--max-new-tokens", str(max_new)] + (["--untrained"] if untrained else []) + (
        ["--limit", str(limit)] if limit else [])
    return json.loads(sh(*args))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--max-new-tokens", type=int, default=64, help="eval generation length")
    p.add_argument("--work", help="work directory (default: a temporary one)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "acceptance"))
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="acceptance-"))
    ckpt, data, run = work / "tiny-qwen3", work / "data", work / "run"
    t0 = time.monotonic()
    sh("trainer.hf_tiny", "--out", str(ckpt))
    gen = sh("trainer.datagen", "generate", "--target", str(ckpt), "--prompts", "trainer/prompts/topics.jsonl",
             "--out", str(data), "--max-new-tokens", "96", "--devices", "cpu").strip().splitlines()[-1]
    gen = gen.replace(f" in {data}", "")
    train_log = sh("trainer.hf_train", "--target", str(ckpt), "--data", str(data), "--run-dir", str(run),
                   "--config", "trainer/configs/tiny-hf-cpu.toml", "--set", f"train.steps={args.steps}",
                   "--eval-prompts", "trainer/prompts/eval.jsonl", "--eval-interval", str(max(1, args.steps // 3)))
    rows = []
    for name, prompts, limit in (("held-out (eval.jsonl)", "trainer/prompts/eval.jsonl", 0),
                                 ("training prompts (first 8)", str(data), 8)):
        for label, untrained in (("untrained (step 0)", True), (f"trained ({args.steps} steps)", False)):
            r = tau(run, prompts, untrained, limit, args.max_new_tokens)
            rows.append({"prompts": name, "drafter": label, "tau": r["tau"], "tokens_per_forward":
                         r["tokens_per_forward"], "lossless": f"{r['lossless_count']}/{r['num_prompts']}"})
    wall = time.monotonic() - t0
    header = f"| {'prompts':<27} | {'drafter':<20} | {'tau':>6} | {'tokens/target fwd':>17} | {'lossless':>8} |"
    lines = [header, "|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|"]
    for r in rows:
        lines.append(f"| {r['prompts']:<27} | {r['drafter']:<20} | {r['tau']:>6.2f} | "
                     f"{r['tokens_per_forward']:>17.2f} | {r['lossless']:>8} |")
    table = "\n".join(lines)
    evals = [ln for ln in train_log.splitlines() if ln.startswith("eval ")]
    cmd = f".venv/bin/python benchmarks/acceptance.py --steps {args.steps} --max-new-tokens {args.max_new_tokens}"
    md = "\n".join([
        "# Acceptance length on the tiny Hugging Face target (CPU)", "",
        f"Command: `{cmd}`  ", f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPU cores (shared), wall {wall:.0f} s. CPU only: no GPU figures here.", "",
        "Target: random tiny Qwen3 (6 layers, hidden 64, vocab 385) written by `python -m trainer.hf_tiny`. Data: "
        f"its greedy answers to trainer/prompts/topics.jsonl — {gen}. Drafter: 2 layers, block 16, trained with "
        f"2 drafter threads (trainer/configs/tiny-hf-cpu.toml). Eval: greedy block speculative decoding, "
        f"{args.max_new_tokens} new tokens per prompt; tau = tokens kept per verification step "
        "(1.0 = the drafter never helps, 16 = every draft accepted).", "",
        table, "", "Periodic evaluation during training (`eval step=` lines: first 4 held-out prompts, "
        "32 new tokens):", "",
        *[f"    {e}" for e in evals], ""])
    Path(args.out + ".md").write_text(md)
    Path(args.out + ".json").write_text(json.dumps({"command": cmd, "rows": rows, "generate": gen,
                                                    "train_eval_lines": evals, "wall_s": wall}, indent=1))
    print(table)
    print(f"\nsaved {args.out}.md ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
