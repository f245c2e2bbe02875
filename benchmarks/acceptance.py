"""Acceptance length tau on a target that has learned something, end to end on the CPU, beside its baselines.

    .venv/bin/python benchmarks/acceptance.py [--quick] [--steps N] [--train-prompts N] [--max-new-tokens N]
                                              [--cache DIR] [--work DIR] [--out PREFIX]

Runs the real commands in order:
1. the small Qwen3 target trained on the Python standard library's source (`trainer.small_target`, cached under
   --cache, default .dflash/cache; built in a few minutes when missing);
2. prompts from its corpus: "Write the Python function `name`: <docstring summary>" for functions of the training
   files (the training prompts) and of the held-out files (the held-out prompts, never seen in training);
3. target-generated data: the target answers the training prompts greedily (`python -m trainer.data generate`);
4. a drafter trained on it (`python -m trainer --config trainer/configs/tiny-hf-cpu.toml`, 2 drafter threads);
5. `python -m trainer.eval`, the paper's measurement (tau = mean over requests of each request's mean acceptance
   length, KV caches, lossless check at temperature 0, wall-clock speedup against target-only cached decoding), at
   temperature 0 and 1, for three drafts on the same prompts in the same run: prompt lookup (n-gram), the untrained
   (step-0) drafter and the trained drafter; on the held-out prompts and (unless --quick) on the shipped benchmark
   prompt sets (trainer/prompts/bench: GSM8K, MATH500, HumanEval, MBPP, MT-Bench shapes).
Prints the table and writes PREFIX.md (+ .json); the default PREFIX is benchmarks/results/acceptance. `--quick` is
the `make demo` variant: fewer steps and prompts, held-out prompts only. CPU only: no GPU figures here; the speedup
column is what this CPU measured, below 1 where drafting costs more than it saves.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
sys.path.insert(0, str(REPO))


def sh(*args: str, timeout: float = 3600) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([PY, "-m", *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode not in (0, 1):  # trainer.eval exits 1 when a prompt is not lossless: the table shows it
        raise SystemExit(f"{' '.join(args[:2])} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


def write_prompts(path: Path, texts: list[str], count: int, seed: int) -> int:
    """Chat prompts asking for the corpus's functions by name and docstring summary (their sources not given)."""
    from trainer.small_target import chat_samples

    samples = chat_samples(texts, max_chars=1200)
    random.Random(seed).shuffle(samples)
    rows = [{"messages": [s[0]]} for s in samples[:count]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def evaluate(run: Path, target: Path, source: list[str], draft: str, untrained: bool, temperature: float,
             max_new: int, limit: int) -> dict:
    args = ["trainer.eval", "--checkpoint", str(run), "--target", str(target), *source, "--json", "--threads", "1",
            "--max-new-tokens", str(max_new), "--temperature", str(temperature), "--draft", draft, "--seed", "0"]
    if untrained:
        args.append("--untrained")
    if limit:
        args += ["--limit", str(limit)]
    return json.loads(sh(*args))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the make-demo variant: held-out prompts only, fewer steps")
    p.add_argument("--steps", type=int, help="drafter training steps (default 600; 250 with --quick)")
    p.add_argument("--train-prompts", type=int, help="prompts the target answers (default 400; 150 with --quick)")
    p.add_argument("--heldout-prompts", type=int, help="held-out prompts evaluated (default 12; 8 with --quick)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="per request in the evaluation")
    p.add_argument("--bench-limit", type=int, default=3, help="prompts per benchmark set (0 = all)")
    p.add_argument("--cache", default=str(REPO / ".dflash" / "cache"), help="where the small target is cached")
    p.add_argument("--work", help="work directory (default: a temporary one)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "acceptance"), help="output path prefix")
    args = p.parse_args()
    args.steps = args.steps or (250 if args.quick else 600)
    args.train_prompts = args.train_prompts or (150 if args.quick else 400)
    args.heldout_prompts = args.heldout_prompts or (8 if args.quick else 12)
    work = Path(args.work or tempfile.mkdtemp(prefix="acceptance-"))
    data, run = work / "data", work / "run"
    phases: dict[str, float] = {}
    t0 = last = time.monotonic()

    def phase(name: str) -> None:
        nonlocal last
        now = time.monotonic()
        phases[name] = now - last
        last = now
        print(f"  {name}: {phases[name]:.0f} s", file=sys.stderr, flush=True)

    from trainer.small_target import SmallTargetConfig, ensure_small_target, read_meta, split_corpus

    target = ensure_small_target(args.cache, log=lambda m: print(f"  small target: {m}", file=sys.stderr))
    meta = read_meta(target) or {}
    phase("small target")
    train_texts, heldout_texts, _ = split_corpus(SmallTargetConfig())
    n_train = write_prompts(work / "train.jsonl", train_texts, args.train_prompts, seed=1)
    n_held = write_prompts(work / "heldout.jsonl", heldout_texts, args.heldout_prompts, seed=2)
    gen = sh("trainer.data", "generate", "--target", str(target), "--prompts", str(work / "train.jsonl"),
             "--out", str(data), "--max-new-tokens", "160", "--devices", "cpu")
    gen = gen.strip().splitlines()[-1].replace(f" in {data}", "")
    phase("generate")
    train_log = sh("trainer", "--config", "trainer/configs/tiny-hf-cpu.toml", "--run-dir", str(run),
                   "--set", f"target.path={target}", "--set", f"data.dir={data}", "--set", f"train.steps={args.steps}",
                   "--set", "train.seq_len=192", "--set", "train.num_anchors=16", "--set", "data.prompt_len=16",
                   "--set", "drafter.intermediate_size=384", "--set", "eval.interval=0",
                   "--set", "train.checkpoint_interval=0", "--set", f"train.warmup_steps={max(1, args.steps // 20)}")
    losses = [ln for ln in train_log.splitlines() if ln.startswith("step=")]
    phase("train")
    sources = [("held-out functions", ["--prompts", str(work / "heldout.jsonl")], 0)]
    if not args.quick:
        sources.append(("bench", ["--bench", "trainer/prompts/bench"], args.bench_limit))
    drafts = [("prompt lookup (n-gram)", "ngram", False), ("untrained drafter (step 0)", "dflash", True),
              (f"trained drafter ({args.steps} steps)", "dflash", False)]
    rows = []
    for temperature in (0.0, 1.0):
        for src_name, src, limit in sources:
            for label, draft, untrained in drafts:
                doc = evaluate(run, target, src, draft, untrained, temperature, args.max_new_tokens, limit)
                for s in doc["sets"]:
                    name = src_name if src_name != "bench" else s["name"]
                    rows.append({"prompts": name, "temperature": temperature, "draft": label, "tau": s["tau"],
                                 "speedup": s["speedup"], "requests": s["num_prompts"],
                                 "lossless": f"{s['lossless_count']}/{s['checked']}" if temperature == 0 else "-"})
    phase("eval")
    wall = time.monotonic() - t0
    md_table = render(rows)
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in phases.items())
    cmd = (f".venv/bin/python benchmarks/acceptance.py --steps {args.steps} --train-prompts {args.train_prompts} "
           f"--max-new-tokens {args.max_new_tokens}{' --quick' if args.quick else ''}")
    md = "\n".join([
        "# Acceptance length on a trained small target (CPU)", "",
        f"Command: `{cmd}`  ", f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPU "
        f"cores (shared), wall {wall:.0f} s ({timing}). CPU only: no GPU figures here.", "",
        f"Target: `trainer.small_target`, a {meta.get('parameters', '?')}-parameter Qwen3 trained "
        f"{meta.get('steps', '?')} steps on the standard library's source (held-out loss "
        f"{meta.get('heldout_loss_init', 0):.2f} -> {meta.get('heldout_loss_final', 0):.2f} nats). Data: its greedy "
        f"answers to {n_train} training prompts — {gen}. Drafter: 2 layers, block 16, {args.steps} steps, 2 drafter "
        f"threads. Eval (`python -m trainer.eval`): {n_held} held-out prompts (functions of files the target never "
        f"trained on){'' if args.quick else f', and {args.bench_limit} prompts of each shipped benchmark set'}, "
        f"{args.max_new_tokens} new tokens at most per request; tau = mean over requests of each request's mean "
        "acceptance length (the paper's); speedup = target-only cached decoding time per token / speculative, as "
        "measured on this CPU; lossless = output equal to target-only greedy (temperature 0).", "",
        md_table, "",
        "Training (`step=` lines, first and last):", "",
        *[f"    {ln}" for ln in (losses[:1] + losses[-1:])], ""])
    Path(args.out + ".md").write_text(md)
    Path(args.out + ".json").write_text(json.dumps({"command": cmd, "rows": rows, "generate": gen, "wall_s": wall,
                                                    "phases_s": phases, "target": meta.get("parameters")}, indent=1))
    print(md_table)
    print(f"\nwall {wall:.0f} s ({timing}); saved {args.out}.md")
    return 0


def render(rows: list[dict]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    header = "| prompts | T | draft | requests | tau | speedup (CPU) | lossless |"
    lines = [header, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['prompts']} | {r['temperature']:g} | {r['draft']} | {r['requests']} | "
                     f"{num(r['tau'], '.2f')} | {num(r['speedup'], '.2f')} | {r['lossless']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
