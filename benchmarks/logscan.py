"""Log scanning cost: a big train.log growing by 1 MB, against a full rescan and against `grep -E`.

What it shows (DESIGN §8, issue 16): the incremental scanner's cost follows the NEW bytes, not the file size,
and what the first full scan costs next to the seed's `grep -E "Exception|tok/s|step=" | tail -15` on the
same file, and next to the way before (64 MB reads, special lines found by the plain regex of anchors,
rawlines.NextSpecial), run once per size as the in-run baseline. The full scan is what diagnose does: the
file mapped and scanned as one buffer (LogScanner.feed_file), special lines found by GNU grep -F in a process
of its own while Python handles them (grepfind.py); "pivot" is the same scan where grep is missing (the pivot
search, anchorfind.py, as before grep was used).

    .venv/bin/python benchmarks/logscan.py [--size-mb 2048] [--dir /tmp] [--out benchmarks/results/logscan.txt]

The log is realistic trainer output (progress lines, data/compile log lines, warnings, a few healthy
look-alikes) written in 64 MB blocks; each growth step appends 1 MB that ends in a thread traceback.
Numbers are from one run on one machine; compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import random
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
GROWTH_STEPS = 7  # median of this many 1 MB appends per size (one run on a busy machine is noisy)
GREP = ["grep", "-E", "Exception|tok/s|step="]


def block(size: int, first_step: int, seed: int = 0) -> tuple[bytes, int]:
    """Trainer-like output: ~60 % progress lines, data/compile INFO lines, warnings, 1 % look-alikes."""
    rng = random.Random(seed)
    out: list[str] = []
    n, step = 0, first_step
    while n < size:
        r = rng.random()
        if r < 0.6:
            step += 1
            line = (f"step={step} loss={4 / (1 + step / 1e4):.4f} tok/s={1800 + rng.random() * 50:.1f} "
                    f"lr=3.00e-04 acc={rng.random():.3f} acc_len={2 + rng.random():.2f}\n")
        elif r < 0.8:
            line = f"INFO data: shard {step % 1000} loaded, 4096 sequences, {4096 * 2048} tokens\n"
        elif r < 0.99:
            line = ("W1129 09:51:13.201000 91451 torch/_inductor/utils.py:1250] [0/0] Not enough SMs to use "
                    "max_autotune_gemm mode\n")
        else:
            line = "eval: error_rate=0.0123 retries=0 NaN check passed\n"
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


def full_scan(path: Path, use_grep: bool = True) -> tuple[float, LogScanner]:
    """The first look at the log as diagnose takes it: the file mapped and scanned in one go (use_grep=False:
    as where grep is missing, the pivot search alone)."""
    saved = grepfind.GREP
    grepfind.GREP = saved if use_grep else "dflash-no-such-grep"
    try:
        s = LogScanner()
        t0 = time.perf_counter()
        with path.open("rb") as f:
            s.feed_file(f)
        return time.perf_counter() - t0, s
    finally:
        grepfind.GREP = saved


def plain_scan(path: Path) -> tuple[float, LogScanner]:
    """The way before (the baseline): BLOCK-sized reads, special lines found by the anchors' regex."""
    saved = logscan.next_special
    logscan.next_special = lambda buf, end, extra, fd=None: rawlines.NextSpecial(buf, end, rawlines.SPECIAL_RE)
    try:
        s = LogScanner()
        t0 = time.perf_counter()
        with path.open("rb") as f:
            while chunk := f.read(BLOCK):
                s.feed(chunk)
        return time.perf_counter() - t0, s
    finally:
        logscan.next_special = saved


def grep(path: Path) -> float:
    t0 = time.perf_counter()
    p1 = subprocess.Popen([*GREP, str(path)], stdout=subprocess.PIPE)
    subprocess.run(["tail", "-15"], stdin=p1.stdout, stdout=subprocess.DEVNULL, check=False)
    p1.wait()
    return time.perf_counter() - t0


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
                (full_s, _), (full_s2, scanner) = full_scan(path), full_scan(path)
                full_s = min(full_s, full_s2)
                pivot_s, pivot = full_scan(path, use_grep=False)
                plain_s, plain = plain_scan(path)
                mine = scanner.report()
                for other in (pivot.report(), plain.report()):
                    assert (mine.tracebacks, mine.progress, mine.hits, mine.last_line_no) == (
                        other.tracebacks, other.progress, other.hits, other.last_line_no), "the scans disagree"
                grep_s = min(grep(path), grep(path))
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
                rows.append((cp, full_s, pivot_s, plain_s, grep_s, inc_s))
                print(f"  {cp >> 20} MB: full scan {full_s:.2f} s (pivot {pivot_s:.2f} s, before {plain_s:.2f} s), "
                      f"grep {grep_s:.2f} s, "
                      f"+1 MB {inc_s * 1000:.1f} ms", flush=True)
    finally:
        path.unlink(missing_ok=True)
    lines += [
        "",
        f"{'log size':>9} | {'full scan (best/2)':>18} | {'MB/s':>6} | {'grep -E|tail':>12} | {'scan/grep':>9} | "
        f"{'pivot, no grep':>14} | {'pivot/grep':>10} | {'before (64 MB reads, regex)':>27} | {'before/grep':>11} | "
        f"{'+1 MB (median of 7)':>19} | {'full/incremental':>16}",
        "-" * 185,
    ]
    for size, full_s, pivot_s, plain_s, grep_s, inc_s in rows:
        lines.append(f"{size >> 20:>6} MB | {full_s:>16.2f} s | {(size >> 20) / full_s:>6.0f} | {grep_s:>10.2f} s | "
                     f"{full_s / grep_s:>8.1f}x | {pivot_s:>12.2f} s | {pivot_s / grep_s:>9.1f}x | "
                     f"{plain_s:>25.2f} s | {plain_s / grep_s:>10.1f}x | "
                     f"{inc_s * 1000:>16.1f} ms | {full_s / inc_s:>15.0f}x")
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
