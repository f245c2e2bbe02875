"""Log scanning cost: a big train.log growing by 1 MB, against a full rescan and against `grep -E`.

What it shows (DESIGN §8, issue 16): the incremental scanner's cost follows the NEW bytes, not the file size,
and what the first full scan costs next to the seed's `grep -E "Exception|tok/s|step=" | tail -15` on the
same file, and next to the way before (64 MB reads, special lines found by the plain regex of anchors,
rawlines.NextSpecial), run once per size as the in-run baseline. The full scan is what diagnose does: the
file mapped and scanned as one buffer (LogScanner.feed_file), special lines found by GNU grep -F in a process
of its own while Python handles them (grepfind.py); "pivot" is the same scan where grep is missing (the pivot
search, anchorfind.py, as before grep was used).

    .venv/bin/python benchmarks/logscan.py [--size-mb 2048] [--dir /tmp] [--out benchmarks/results/logscan.txt]

The log is realistic output of a 4-rank run (issue 28): every line with its rank's tee prefix, progress lines and
tqdm bars (several `\r` updates a line), data/compile log lines, torch warnings, ~1 % DeepSpeed `[WARNING]`/`[INFO]`
lines about overflow, skipped steps and error_rate, a few healthy look-alikes; written in 64 MB blocks; each growth
step appends 1 MB that ends in a thread traceback.
Numbers are from one run on one machine; compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflashctl.analysis import grepfind, logscan, rawlines  # noqa: E402
from dflashctl.analysis.logscan import LogScanner  # noqa: E402

BLOCK = 64 << 20
GROWTH = 1 << 20
ROUNDS = 3  # full scans and greps per size, in turns (best of each)
GROWTH_STEPS = 7  # median of this many 1 MB appends per size (one run on a busy machine is noisy)
GREP = ["grep", "-E", "Exception|tok/s|step="]


RANKS = 4  # ranks whose output interleaves (torchrun's `[rankN]:` / `[defaultN]:` tee prefixes)
BAR = "\u2588"


def _bar(step: int, total: int, rate: float) -> str:
    """A tqdm bar as it lands in a file: several updates on one line, joined by \\r."""
    parts = []
    for s in range(step - 2, step + 1):
        pct = s * 100 // total
        fill = BAR * (pct // 10)
        parts.append(f"{pct:3d}%|{fill:<10}| {s}/{total} [02:15<02:45, {rate:5.2f}it/s, loss=2.31]")
    return "\r" + "\r".join(parts)


def _deepspeed(rng: random.Random, step: int, rank: int) -> str:
    """DeepSpeed's own [WARNING]/[INFO] lines, the healthy ones that say error_rate, overflow, skipping, flushes."""
    stamp = f"[2026-11-29 09:{step % 60:02d}:{rng.randrange(60):02d},{rng.randrange(1000):03d}]"
    r = rng.random()
    if r < 0.4:
        return (f"{stamp} [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank {rank} Skipping step. "
                f"Attempted loss scale: 65536, reducing to 32768")
    if r < 0.7:
        return (f"{stamp} [WARNING] [stage3.py:2069:step] {rng.randrange(1, 9)} pytorch allocator cache flushes since "
                "last step. this happens when there is high memory pressure and is detrimental to performance. if "
                "this is happening frequently consider adjusting settings to reduce memory consumption.")
    return (f"{stamp} [WARNING] [engine.py:2203:_take_model_step] step {step}: overflow=True skipped_steps="
            f"{rng.randrange(40)} error_rate={rng.random() / 100:.4f} grad_norm_overflow check: retrying with a "
            "lower loss scale")


def block(size: int, first_step: int, seed: int = 0) -> tuple[bytes, int]:
    """Trainer-like output of several ranks: ~55 % progress lines (some as tqdm bars), data/compile INFO lines,
    torch warnings, ~1 % DeepSpeed [WARNING]/[INFO] lines about overflow and error_rate, a few look-alikes; every
    line carries its rank's prefix, as torchrun's tee writes them."""
    rng = random.Random(seed)
    out: list[str] = []
    n, step = 0, first_step
    while n < size:
        r = rng.random()
        rank = rng.randrange(RANKS)
        prefix = f"[rank{rank}]:" if rng.random() < 0.7 else f"[default{rank}]:"
        if r < 0.45:
            step += 1
            body = (f"step={step} loss={4 / (1 + step / 1e4):.4f} tok/s={1800 + rng.random() * 50:.1f} "
                    f"lr=3.00e-04 acc={rng.random():.3f} acc_len={2 + rng.random():.2f}")
        elif r < 0.55:
            step += 1
            body = _bar(step, 10 ** 7, 3 + rng.random())
        elif r < 0.75:
            body = f"INFO data: shard {step % 1000} loaded, 4096 sequences, {4096 * 2048} tokens"
        elif r < 0.98:
            body = ("W1129 09:51:13.201000 91451 torch/_inductor/utils.py:1250] [0/0] Not enough SMs to use "
                    "max_autotune_gemm mode")
        elif r < 0.99:
            body = _deepspeed(rng, step, rank)
        else:
            body = "eval: error_rate=0.0123 retries=0 NaN check passed"
        line = f"{prefix}{body}\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()[:size], step


def growth(step: int) -> bytes:
    """1 MB of new log that ends with a crashed drafter thread's traceback."""
    body, _ = block(GROWTH - 600, step, seed=step)
    body = body[: body.rfind(b"\n") + 1]
    tb = (b"Exception in thread drafter-1:\nTraceback (most recent call last):\n"
          b'  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner\n    self.run()\n'
          b'  File "/workspace/dflash/code/trainer/pipeline.py", line 210, in drafter_loop\n'
          b"    loss = self.step(batch)\n"
          b"RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. "
          b"This is not supported at the moment.\n")
    return body + tb


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


LAST_CPU: dict[str, float] = {}  # the last full_scan's CPU seconds: "python" (this process), "grep" (its child)


def full_scan(path: Path, use_grep: bool = True, drain: bool = True) -> tuple[float, LogScanner]:
    """The first look at the log as diagnose takes it: the file mapped and scanned in one go (use_grep=False:
    as where grep is missing, the pivot search alone). Notes the CPU seconds of this process and of grep in LAST_CPU
    (a shared machine's load stretches the wall time; the CPU time it costs stays)."""
    saved, saved_drain = grepfind.GREP, grepfind.GrepFinder.DRAIN
    grepfind.GREP = saved if use_grep else "dflash-no-such-grep"
    grepfind.GrepFinder.DRAIN = drain
    try:
        s = LogScanner()
        c0, k0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        with path.open("rb") as f:
            s.feed_file(f)
        wall = time.perf_counter() - t0
        LAST_CPU.update(python=_cpu(resource.RUSAGE_SELF) - c0, grep=_cpu(resource.RUSAGE_CHILDREN) - k0)
        return wall, s
    finally:
        grepfind.GREP, grepfind.GrepFinder.DRAIN = saved, saved_drain


def plain_scan(path: Path) -> tuple[float, LogScanner]:
    """The way before (the baseline): BLOCK-sized reads, special lines found by the anchors' regex."""
    saved = logscan.next_special
    logscan.next_special = lambda buf, end, extra, fd=None: rawlines.NextSpecial(buf, end, rawlines.special_re())
    try:
        s = LogScanner()
        t0 = time.perf_counter()
        with path.open("rb") as f:
            while chunk := f.read(BLOCK):
                s.feed(chunk)
        return time.perf_counter() - t0, s
    finally:
        logscan.next_special = saved


def grep(path: Path) -> tuple[float, float]:
    """(wall, CPU seconds of grep and tail)."""
    k0 = _cpu(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p1 = subprocess.Popen([*GREP, str(path)], stdout=subprocess.PIPE)
    subprocess.run(["tail", "-15"], stdin=p1.stdout, stdout=subprocess.DEVNULL, check=False)
    p1.wait()
    return time.perf_counter() - t0, _cpu(resource.RUSAGE_CHILDREN) - k0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=2048)
    ap.add_argument("--min-mb", type=int, default=256, help="the smallest size measured")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "logscan.txt"))
    args = ap.parse_args()
    checkpoints = sorted({s << 20 for s in (256, 512, 1024, 2048, args.size_mb) if args.min_mb <= s <= args.size_mb})
    path = Path(args.dir) / f"dflash-bench-{os.getpid()}.log"
    rows = []
    lines = [f"log scanning benchmark: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, python {sys.version.split()[0]}, "
             f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"]
    try:
        step, written = 0, 0
        blk, step = block(BLOCK, step)
        with path.open("wb") as f:
            for cp in checkpoints:
                while written < cp:
                    f.write(blk[: min(BLOCK, cp - written)])
                    written += min(BLOCK, cp - written)
                f.flush()
                # the first look at a log this big; best of two (a shared machine's noise only adds time)
                # scan and grep taken in turns, best of ROUNDS each: a shared machine's load comes and goes, and
                # only adds time; taking them in turns gives both the same chances of a quiet moment
                walls, cpus, greps, turns = [], [], [], []
                for _ in range(ROUNDS):
                    wall, scanner = full_scan(path)
                    walls.append(wall)
                    cpus.append(dict(LAST_CPU))
                    greps.append(grep(path))
                    turns.append(full_scan(path, drain=False)[0])
                full_s, turn_s = min(walls), min(turns)
                cpu = min(cpus, key=lambda c: c["python"] + c["grep"])
                grep_s, grep_cpu = min(g[0] for g in greps), min(g[1] for g in greps)
                pivot_s, pivot = full_scan(path, use_grep=False)
                plain_s, plain = plain_scan(path)
                mine = scanner.report()
                for other in (pivot.report(), plain.report()):
                    assert (mine.tracebacks, mine.progress, mine.hits, mine.last_line_no) == (
                        other.tracebacks, other.progress, other.hits, other.last_line_no), "the scans disagree"
                incs = []
                for k in range(GROWTH_STEPS):  # what status --watch does with each new probe report
                    new = growth(step + 1 + k)
                    f.write(new)
                    f.flush()
                    written += len(new)
                    t0 = time.perf_counter()
                    events = scanner.feed(new) + scanner.flush()
                    incs.append(time.perf_counter() - t0)
                    assert any(getattr(e, "thread", None) == "drafter-1" for e in events)
                inc_s = statistics.median(incs)
                rows.append((cp, full_s, pivot_s, plain_s, grep_s, inc_s, cpu, grep_cpu, turn_s))
                print(f"  {cp >> 20} MB: full scan {full_s:.2f} s (pivot {pivot_s:.2f} s, before {plain_s:.2f} s), "
                      f"grep {grep_s:.2f} s, "
                      f"+1 MB {inc_s * 1000:.1f} ms", flush=True)
    finally:
        path.unlink(missing_ok=True)
    lines += [
        "",
        f"{'log size':>9} | {'full scan (best/3)':>18} | {'MB/s':>6} | {'grep -E|tail':>12} | {'scan/grep':>9} | "
        f"{'pivot, no grep':>14} | {'pivot/grep':>10} | {'before (64 MB reads, regex)':>27} | {'before/grep':>11} | "
        f"{'+1 MB (median of 7)':>19} | {'full/incremental':>16}",
        "-" * 185,
    ]
    for size, full_s, pivot_s, plain_s, grep_s, inc_s, _, _, _ in rows:
        lines.append(f"{size >> 20:>6} MB | {full_s:>16.2f} s | {(size >> 20) / full_s:>6.0f} | {grep_s:>10.2f} s | "
                     f"{full_s / grep_s:>8.1f}x | {pivot_s:>12.2f} s | {pivot_s / grep_s:>9.1f}x | "
                     f"{plain_s:>25.2f} s | {plain_s / grep_s:>10.1f}x | "
                     f"{inc_s * 1000:>16.1f} ms | {full_s / inc_s:>15.0f}x")
    lines += [
        "",
        "CPU seconds (load-proof: what each costs, whatever else the machine runs). The scan's two processes run side "
        "by side,",
        "so on two free cores its wall time is about the larger of the two: 'critical path'.",
        "",
        f"{'log size':>9} | {'scan: python':>12} | {'scan: grep -F':>13} | {'grep -E|tail':>12} | "
        f"{'critical path/grep':>18} | {'all scan CPU/grep':>17}",
        "-" * 94,
    ]
    for size, *_, cpu, grep_cpu, _ in rows:
        crit = max(cpu["python"], cpu["grep"])
        lines.append(f"{size >> 20:>6} MB | {cpu['python']:>10.2f} s | {cpu['grep']:>11.2f} s | {grep_cpu:>10.2f} s | "
                     f"{crit / grep_cpu:>17.2f}x | {(cpu['python'] + cpu['grep']) / grep_cpu:>16.2f}x")
    lines += [
        "",
        "The same scan with grep's answers read line by line as they are needed (GrepFinder.DRAIN = False, the way "
        "before issue 28: grep and Python take turns on the pipe), in the same rounds:",
        "",
        f"{'log size':>9} | {'drained (now)':>13} | {'turn-taking':>11} | {'grep -E|tail':>12} | {'now/grep':>8} | "
        f"{'turn-taking/grep':>16}",
        "-" * 84,
    ]
    for size, full_s, _, _, grep_s, *_, turn_s in rows:
        lines.append(f"{size >> 20:>6} MB | {full_s:>11.2f} s | {turn_s:>9.2f} s | {grep_s:>10.2f} s | "
                     f"{full_s / grep_s:>7.1f}x | {turn_s / grep_s:>15.1f}x")
    incs = [r[5] for r in rows]
    grew = rows[-1][0] / rows[0][0]
    lines += ["", f"incremental cost of +1 MB across sizes: min {min(incs) * 1000:.1f} ms, "
              f"max {max(incs) * 1000:.1f} ms (ratio {max(incs) / min(incs):.2f} while the file grew {grew:.0f}x): "
              "it tracks the new bytes, not the file size."]
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
