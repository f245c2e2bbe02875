"""Acceptance length tau before and after training, on a tiny Hugging Face target, end to end on the CPU.

    .venv/bin/python benchmarks/acceptance.py [--quick] [--steps 300] [--prompts 240] [--work DIR] [--out PREFIX]

Runs the real commands in order: write a tiny random Qwen3 checkpoint (`python -m trainer.hf_tiny`), let it
answer the topic prompts (`python -m trainer.data generate`, greedy, 96 new tokens), train a drafter
(`python -m trainer --config trainer/configs/tiny-hf-cpu.toml --set target.path=... --set data.dir=...`,
2 drafter threads, periodic `eval step=` lines), then evaluate the step-0 and the trained drafter. tau is measured
by real block speculative decoding (`python -m trainer.eval`) on the held-out prompts of trainer/prompts/eval.jsonl
and on the first 8 training prompts, with the lossless check (output == greedy decoding) on every prompt. Prints
the table with per-phase wall times and writes PREFIX.md (+ .json); the default PREFIX is
benchmarks/results/acceptance. `--quick` (150 steps, 120 prompts, held-out rows only) is the variant for the
end of `make demo`. CPU only; GPU figures are not claimed here.
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
    p.add_argument("--steps", type=int, help="training steps (default 300; 150 with --quick)")
    p.add_argument("--prompts", type=int, help="topic prompts the target answers, the training set (default 240; "
                   "120 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="the make-demo variant: fewer steps and prompts, held-out prompts only (about a minute)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="eval generation length")
    p.add_argument("--work", help="work directory (default: a temporary one)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "acceptance"), help="output path prefix")
    args = p.parse_args()
    args.steps = args.steps or (150 if args.quick else 300)
    args.prompts = args.prompts or (120 if args.quick else 240)
    work = Path(args.work or tempfile.mkdtemp(prefix="acceptance-"))
    ckpt, data, run = work / "tiny-qwen3", work / "data", work / "run"
    phases: dict[str, float] = {}
    t0 = last = time.monotonic()

    def phase(name: str) -> None:
        nonlocal last
        now = time.monotonic()
        phases[name] = now - last
        last = now
        print(f"  {name}: {phases[name]:.0f} s", file=sys.stderr, flush=True)

    sh("trainer.hf_tiny", "--out", str(ckpt))
    phase("checkpoint")
    gen = sh("trainer.data", "generate", "--target", str(ckpt), "--prompts", "trainer/prompts/topics.jsonl",
             "--out", str(data), "--max-new-tokens", "96", "--devices", "cpu", "--limit", str(args.prompts))
    gen = gen.strip().splitlines()[-1].replace(f" in {data}", "")
    phase("generate")
    train_log = sh("trainer", "--config", "trainer/configs/tiny-hf-cpu.toml", "--run-dir", str(run),
                   "--set", f"target.path={ckpt}", "--set", f"data.dir={data}", "--set", f"train.steps={args.steps}",
                   "--set", f"eval.interval={max(1, args.steps // 3)}", "--set", "train.checkpoint_interval=0")
    phase("train")
    rows = []
    sets = [("held-out (eval.jsonl)", "trainer/prompts/eval.jsonl", 0), ("training prompts (first 8)", str(data), 8)]
    for name, prompts, limit in sets[:1] if args.quick else sets:
        for label, untrained in (("untrained (step 0)", True), (f"trained ({args.steps} steps)", False)):
            r = tau(run, prompts, untrained, limit, args.max_new_tokens)
            rows.append({"prompts": name, "drafter": label, "tau": r["tau"], "tokens_per_forward":
                         r["tokens_per_forward"], "lossless": f"{r['lossless_count']}/{r['num_prompts']}"})
    phase("eval")
    wall = time.monotonic() - t0
    header = f"| {'prompts':<27} | {'drafter':<20} | {'tau':>6} | {'tokens/target fwd':>17} | {'lossless':>8} |"
    lines = [header, "|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|"]
    for r in rows:
        lines.append(f"| {r['prompts']:<27} | {r['drafter']:<20} | {r['tau']:>6.2f} | "
                     f"{r['tokens_per_forward']:>17.2f} | {r['lossless']:>8} |")
    table = "\n".join(lines)
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in phases.items())
    evals = [ln for ln in train_log.splitlines() if ln.startswith("eval ")]
    cmd = (f".venv/bin/python benchmarks/acceptance.py --steps {args.steps} --prompts {args.prompts} "
           f"--max-new-tokens {args.max_new_tokens}{' --quick' if args.quick else ''}")
    md = "\n".join([
        "# Acceptance length on the tiny Hugging Face target (CPU)", "",
        f"Command: `{cmd}`  ", f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPU cores (shared), wall {wall:.0f} s ({timing}). CPU only: no GPU figures here.", "",
        "Target: random tiny Qwen3 (6 layers, hidden 64, vocab 385) written by `python -m trainer.hf_tiny`. Data: "
        f"its greedy answers to trainer/prompts/topics.jsonl — {gen}. Drafter: 2 layers, block 16, trained with "
        f"2 drafter threads (`python -m trainer --config trainer/configs/tiny-hf-cpu.toml`). Eval: greedy block "
        f"speculative decoding, {args.max_new_tokens} new tokens per prompt; tau = tokens kept per verification step "
        "(1.0 = the drafter never helps, 16 = every draft accepted).", "",
        table, "", "Periodic evaluation during training (`eval step=` lines: first 4 held-out prompts, "
        "32 new tokens):", "",
        *[f"    {e}" for e in evals], ""])
    Path(args.out + ".md").write_text(md)
    Path(args.out + ".json").write_text(json.dumps({"command": cmd, "rows": rows, "generate": gen,
                                                    "train_eval_lines": evals, "wall_s": wall, "phases_s": phases},
                                                   indent=1))
    print(table)
    print(f"\nwall {wall:.0f} s ({timing}); saved {args.out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
