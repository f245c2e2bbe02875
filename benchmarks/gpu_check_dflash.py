"""The issue-13 pieces on a device: chunked loss, export + the reference package, server-free evaluation.

    .venv/bin/python benchmarks/gpu_check_dflash.py --device cuda:0 --out FILE.md   (called by gpu_check.sh)
    .venv/bin/python benchmarks/gpu_check_dflash.py --device cpu --small --out FILE.md   (its --cpu-dry-run)

1. Chunked loss at the recipe's scale (one drafter's 4 x 512 anchors x 16 = 32,768 rows, vocab 151,936, hidden
   4096, bf16 like the GPU path): peak CUDA memory of forward + backward, chunked (train.loss_chunk 2048) against
   the full logits, and whether loss and gradient agree (bf16 tolerance). --small shrinks it for the CPU.
2. Export + reference: a random drafter over a tiny Qwen3 written here (no download), exported by
   `python -m trainer.export`, loaded by `dflash.model.DFlashDraftModel` on the device: max logit difference to
   ours; the reference `spec_generate` against target-only greedy; tau of the reference's `dflash_generate`
   (its own CUDA timing) against `trainer.eval --init-from` on the same prompts.
3. Server-free evaluation: `trainer.eval --bench trainer/prompts/bench` on the device at temperature 0 and 1 and
   with prompt lookup; tau and the measured speedup against target-only cached decoding.
Every figure is printed as measured; a step that fails prints its error line and the rest go on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def chunked_loss(device: str, small: bool) -> list[str]:
    import torch

    from trainer.loss import chunked_dflash_loss, dflash_loss, position_weights

    rows, hidden, vocab = (2048, 256, 32000) if small else (4 * 512 * 16, 4096, 151936)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    weight = (torch.randn(vocab, hidden) * hidden**-0.5).to(device, dtype)
    h0 = torch.randn(1, rows, hidden).to(device, dtype)
    labels = torch.randint(0, vocab, (1, rows), device=device)
    w = position_weights(16, 7.0, device)
    out = [f"rows {rows}, hidden {hidden}, vocab {vocab}, {str(dtype).removeprefix('torch.')}", "",
           "| loss path | peak MiB above inputs | loss | seconds |", "|---|---|---|---|"]
    results = {}
    for name, chunk in (("chunked 2048", 2048), ("full logits", 0)):
        h = h0.clone().requires_grad_(True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        try:
            if chunk:
                loss = chunked_dflash_loss(h, weight, labels, w, None, chunk)[0]
            else:
                loss = dflash_loss(torch.nn.functional.linear(h, weight), labels, w)[0]
            loss.backward()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.startswith("cuda") else None
            results[name] = (float(loss), h.grad.float())
            out.append(f"| {name} | {'-' if peak is None else f'{peak:.0f}'} | {float(loss):.5f} | "
                       f"{time.perf_counter() - t0:.2f} |")
        except torch.OutOfMemoryError as e:
            out.append(f"| {name} | out of memory ({str(e).splitlines()[0][:80]}) | | |")
        del h
    if len(results) == 2:
        (l1, g1), (l2, g2) = results["chunked 2048"], results["full logits"]
        rel = float((g1 - g2).norm() / g2.norm().clamp_min(1e-30))
        out += ["", f"loss difference {abs(l1 - l2):.2e}, gradient relative difference {rel:.2e}"]
    return out


def sh(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(args[:2])} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def export_and_reference(device: str, work: Path) -> list[str]:
    import dflash.model as ref_model
    import torch

    from trainer import checkpoint
    from trainer.config import load_config
    from trainer.export import drafter_meta
    from trainer.hf import build_target
    from trainer.hf_tiny import make_tiny_checkpoint
    from trainer.model import build_drafter

    ckpt = make_tiny_checkpoint(work / "tiny-qwen3", "qwen3")
    cfg = load_config(None, [f"target.path={ckpt}", "drafter.block_size=8", "target.dtype=float32",
                             f"devices.target=['{device}']"])
    target = build_target(cfg)
    torch.manual_seed(3)
    drafter = build_drafter(target, cfg.drafter, len(cfg.layer_ids), device)
    checkpoint.save(work / "run", 1, {"step": 1, "drafter": drafter.state_dict(), "optimizer": {},
                                      "config": cfg.to_dict(), "drafter_meta": drafter_meta(cfg)}, keep=1)
    sh("trainer.export", "--checkpoint", str(work / "run"), "--out", str(work / "drafter"), "--dtype", "float32")
    ref = ref_model.DFlashDraftModel.from_pretrained(str(work / "drafter"), dtype=torch.float32).to(device).eval()
    ids = torch.randint(0, 300, (1, 24), device=device)
    with torch.no_grad():
        feats = target.hidden_states(ids, cfg.layer_ids)
        block = torch.full((1, 8), cfg.mask_token_id, device=device)
        block[0, 0] = 11
        noise = ref_model._raw_input_embeddings(target.model, block)
        theirs = ref.compute_logits(ref(target_hidden=feats, noise_embedding=noise,
                                        position_ids=torch.arange(32, device=device)[None]), target.model.lm_head)
        ours = drafter.draft_logits(feats, 0, block, drafter.new_cache())
    out = [f"max |logit difference| ours vs reference on {device}: {float((ours - theirs).abs().max()):.2e}"]
    prompt = ids[:, :12]
    spec = ref.spec_generate(target.model, prompt, max_new_tokens=64, stop_token_ids=None)
    greedy = target.model.generate(prompt, max_new_tokens=64, do_sample=False, eos_token_id=None, pad_token_id=0)
    out.append(f"reference spec_generate == target-only greedy (64 tokens): {spec[0].tolist() == greedy[0].tolist()}")
    rows = [[3, 17, 40, 8, 99, 12], [250, 7, 7, 31], [5, 6, 7, 8, 9, 10, 11]]
    prompts = work / "p.jsonl"
    prompts.write_text("".join(json.dumps({"ids": r}) + "\n" for r in rows))
    taus = []
    for r in rows:
        stats = ref_model.dflash_generate(ref, target.model, torch.tensor([r], device=device), 64, None,
                                          return_stats=True) if device.startswith("cuda") else None
        if stats is not None:
            taus.append(sum(stats.acceptance_lengths) / len(stats.acceptance_lengths))
    doc = json.loads(sh("trainer.eval", "--init-from", str(work / "drafter"), "--target", str(ckpt), "--prompts",
                        str(prompts), "--max-new-tokens", "64", "--device", device, "--target-devices", device,
                        "--set", "target.dtype=float32", "--json"))
    ref_tau = f"{sum(taus) / len(taus):.4f}" if taus else "not run (return_stats needs CUDA)"
    out.append(f"tau: trainer.eval {doc['tau']:.4f} (lossless {doc['lossless_count']}/{len(rows)}), reference "
               f"dflash_generate {ref_tau} (a random drafter: both near 1)")
    return out


def bench_eval(device: str, work: Path, small: bool) -> list[str]:
    ckpt = work / "tiny-qwen3"
    out = ["| draft | temperature | tau | baseline ms/token | speculative ms/token | speedup |",
           "|---|---|---|---|---|---|"]
    for draft, temp in (("dflash", 0.0), ("dflash", 1.0), ("ngram", 0.0)):
        doc = json.loads(sh("trainer.eval", "--init-from", str(work / "drafter"), "--target", str(ckpt),
                            "--set", "target.dtype=float32", "--bench", "trainer/prompts/bench", "--limit", "2",
                            "--max-new-tokens", "64" if small else "512", "--device", device, "--target-devices",
                            device, "--draft", draft, "--temperature", str(temp), "--json"))
        fmt = lambda v, k=1e3: "-" if v is None else f"{v * k:.2f}"  # noqa: E731
        out.append(f"| {draft} | {temp} | {fmt(doc.get('tau'), 1)} | {fmt(doc.get('baseline_tpot_s'))} | "
                   f"{fmt(doc.get('spec_tpot_s'))} | {fmt(doc.get('speedup'), 1)} |")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--small", action="store_true", help="CPU dry-run sizes")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import torch

    work = Path(tempfile.mkdtemp(prefix="gpu-check-dflash-"))
    dry = "CPU DRY RUN, not GPU figures; " if args.device == "cpu" else ""
    lines = [f"## Issue-13 pieces on {args.device} ({dry}torch {torch.__version__})", ""]
    for title, step in (("Chunked loss", lambda: chunked_loss(args.device, args.small)),
                        ("Export and the reference package", lambda: export_and_reference(args.device, work)),
                        ("Server-free evaluation (step 2's random drafter, tiny random target: timing, not quality)",
                         lambda: bench_eval(args.device, work, args.small))):
        lines += [f"### {title}", ""]
        try:
            lines += step()
        except Exception as e:  # report and go on: one broken piece must not hide the others' figures
            lines.append(f"FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            traceback.print_exc()
        lines.append("")
        Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
