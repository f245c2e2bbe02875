"""Peak memory of the DFlash loss (LM head + CE, forward + backward): chunked against the full logits.

    .venv/bin/python benchmarks/loss_memory.py [--hidden 256] [--vocab 151936] [--limit-gb 8] [--skip-compile]

What is measured: the peak of live CPU tensor bytes allocated during one loss forward + backward, above what
existed before it (the LM head weight and the hidden states are allocated first and not counted), read from
torch.profiler(profile_memory=True): the CPU allocator reports every allocation and free with its running
total ("Total Allocated" in the trace), and the peak is the largest running total. Each case runs in a fresh
subprocess, which also reports its peak-RSS growth over the same window (ru_maxrss; glibc returns these large
blocks to the OS, so RSS follows the tensors). CPU, fp32, one sequence of `anchors` blocks of 16 (rows =
anchors x 16), vocab 151,936 (Qwen3); the logits' size does not depend on the hidden size, so it is small
(256) to keep the matmuls to seconds on 2 cores. A case whose extrapolated need exceeds --limit-gb is not run:
its row says "not run" with the computed need (factor measured on the smaller unchunked cases x rows x V x 4 B).

Part 2 (unless --skip-compile) is why trainer/compile.py compiles only the drafter's hidden states when the loss
is chunked: the same chunked loss put through torch.compile keeps every chunk's logits alive for the backward.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BLOCK = 16
ANCHORS = (64, 128, 512)
CHUNKS = (0, 2048, 512)  # 0 = the full logits (dflash_loss); else rows per chunk (chunked_dflash_loss)
GIB = 2**30


def _profiled_peak(fn) -> tuple[float, int]:
    """(peak live bytes allocated inside `fn` above the bytes live before it, RSS high-water growth in bytes)."""
    from torch.profiler import ProfilerActivity, profile

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return float(max(totals, default=0)), rss


def case(anchors: int, chunk: int, hidden: int, vocab: int) -> dict:
    """One measurement (runs inside the subprocess)."""
    import torch

    from trainer.loss import chunked_dflash_loss, dflash_loss, position_weights

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = anchors * BLOCK
    weight = torch.randn(vocab, hidden) * hidden**-0.5
    h = torch.randn(1, rows, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, (1, rows))
    w = position_weights(BLOCK, 7.0)

    def step() -> None:
        if chunk:
            loss = chunked_dflash_loss(h, weight, labels, w, None, chunk)[0]
        else:
            loss = dflash_loss(torch.nn.functional.linear(h, weight), labels, w)[0]
        loss.backward()

    t0 = time.perf_counter()
    peak, rss = _profiled_peak(step)
    return {"anchors": anchors, "chunk": chunk, "rows": rows, "peak_bytes": peak, "rss_bytes": rss,
            "seconds": round(time.perf_counter() - t0, 1)}


def compile_check() -> dict:
    """The chunked loss compiled whole vs eager: bytes still live after the forward (what the backward keeps)."""
    import torch

    from trainer.loss import chunked_dflash_loss, position_weights

    torch.set_num_threads(1)
    rows, vocab, hidden, chunk = 2048, 32000, 64, 256
    weight = torch.randn(vocab, hidden) * 0.05
    h = torch.randn(1, rows, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, (1, rows))
    w = position_weights(BLOCK, 7.0)

    def loss_fn(x):
        return chunked_dflash_loss(x, weight, labels, w, None, chunk)[0]

    out = {"rows": rows, "vocab": vocab, "chunk": chunk, "full_logits_bytes": rows * vocab * 4}
    for name, fn in (("eager", loss_fn), ("compiled", torch.compile(loss_fn))):
        fn(h).backward()  # compile / warm
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss = fn(h)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            totals = [e["args"]["Total Allocated"] for e in json.loads(Path(path).read_text())["traceEvents"]
                      if e.get("name") == "[memory]"]
        out[f"{name}_live_after_forward_bytes"] = totals[-1] if totals else 0
        del loss
    return out


def run_sub(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"case {args} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--limit-gb", type=float, default=8.0, help="don't run a case needing more than this")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "loss_memory.md"))
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        if args.child == ["compile"]:
            print(json.dumps(compile_check()))
        else:
            print(json.dumps(case(*map(int, args.child), args.hidden, args.vocab)))
        return 0

    logit_bytes = lambda rows: rows * args.vocab * 4  # noqa: E731  one fp32 [rows, V] buffer
    results: dict[tuple[int, int], dict] = {}
    factor = 0.0  # unchunked peak / one fp32 logits buffer, measured on the cases that fit
    for anchors in ANCHORS:
        for chunk in CHUNKS:
            rows = anchors * BLOCK
            need = (factor or 4.0) * logit_bytes(rows) if chunk == 0 else 1.5 * logit_bytes(min(chunk, rows))
            if need > args.limit_gb * GIB:
                results[anchors, chunk] = {"rows": rows, "need_bytes": need}
                print(f"anchors={anchors} chunk={chunk}: not run, needs ~{need / GIB:.1f} GiB", flush=True)
                continue
            r = run_sub(str(anchors), str(chunk), "--hidden", str(args.hidden), "--vocab", str(args.vocab))
            results[anchors, chunk] = r
            if chunk == 0:
                factor = max(factor, r["peak_bytes"] / logit_bytes(rows))
            print(f"anchors={anchors} chunk={chunk}: peak {r['peak_bytes'] / GIB:.2f} GiB "
                  f"rss +{r['rss_bytes'] / GIB:.2f} GiB ({r['seconds']} s)", flush=True)
    comp = None if args.skip_compile else run_sub("compile", "--hidden", str(args.hidden))
    text = render(results, comp, args, factor)
    print(text)
    Path(args.out).write_text(text)
    return 0


def render(results: dict, comp: dict | None, args, factor: float) -> str:
    def gib(b: float) -> str:
        return f"{b / GIB:.2f}"

    lines = ["# DFlash loss memory: chunked LM head + CE vs the full logits", "",
             f"    .venv/bin/python benchmarks/loss_memory.py --hidden {args.hidden} --vocab {args.vocab} "
             f"--limit-gb {args.limit_gb:g}", "",
             "Peak live CPU tensor bytes of one loss forward + backward (torch.profiler profile_memory, above what "
             "was live before: LM head weight and hidden states not counted), one sequence, block 16, fp32, "
             f"vocab {args.vocab:,}, hidden {args.hidden} (the logits' size does not depend on it). "
             "RSS = the subprocess's peak-RSS growth over the same window (it agrees with the tensor peak within "
             "0.1 GiB). Ratio = unchunked peak / this peak.", "",
             "| anchors | rows | loss | peak GiB | RSS growth GiB | ratio vs unchunked | time s |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for anchors in ANCHORS:
        base = results.get((anchors, 0), {})
        base_peak = base.get("peak_bytes") or base.get("need_bytes")
        for chunk in CHUNKS:
            r = results[anchors, chunk]
            name = "unchunked" if chunk == 0 else f"chunk {chunk} rows"
            if "peak_bytes" not in r:
                lines.append(f"| {anchors} | {r['rows']} | {name} | not run: needs ~{gib(r['need_bytes'])} "
                             "(computed) | | | |")
                continue
            ratio = "1" if chunk == 0 else f"{base_peak / r['peak_bytes']:.1f}" + ("" if "peak_bytes" in base
                                                                                     else " (vs computed)")
            lines.append(f"| {anchors} | {r['rows']} | {name} | {gib(r['peak_bytes'])} | {gib(r['rss_bytes'])} | "
                         f"{ratio} | {r['seconds']} |")
    lines += ["", f"Unchunked peak = {factor:.2f} x one fp32 [rows, vocab] buffer (the logits, the log-softmax "
              "saved for backward, its gradient); the computed need of a case not run is that factor x rows x vocab "
              "x 4 B. Chunked peak is about one fp32 [chunk, vocab] buffer whatever the rows (in-place exp / "
              "softmax in trainer/loss.py _ChunkedCE).", "",
              f"The recipe (4 sequences x 512 anchors = 32,768 rows per drafter): unchunked ~"
              f"{gib(factor * 32768 * args.vocab * 4)} GiB of fp32 logits buffers on this path, chunk 2048 ~"
              f"{gib(results[512, 2048]['peak_bytes'])} GiB (it does not grow with rows)."]
    if comp:
        lines += ["", "## The chunked loss compiled whole (why only the drafter's hidden states are compiled)", "",
                  f"rows {comp['rows']}, vocab {comp['vocab']:,}, chunk {comp['chunk']}: full logits "
                  f"{comp['full_logits_bytes'] / 2**20:.0f} MiB. Still live after the forward (saved for the "
                  f"backward): eager {comp['eager_live_after_forward_bytes'] / 2**20:.1f} MiB, torch.compile "
                  f"{comp['compiled_live_after_forward_bytes'] / 2**20:.1f} MiB: AOTAutograd merges the backward's "
                  "recomputed chunk matmuls with the forward's and saves every chunk's logits."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
