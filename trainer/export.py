"""Export a trained drafter in the layout the DFlash ecosystem loads, and load such a directory back.

`python -m trainer.export --checkpoint RUN_DIR|step-N.pt --out DIR [--dtype bfloat16|float32]`

writes DIR/config.json (trainer/drafter_format.py says which keys) and DIR/model.safetensors (the drafter's own
weights, parameter names as the reference's `DFlashDraftModel`), so `dflash.model.DFlashDraftModel
.from_pretrained(DIR)`, SGLang's `--speculative-draft-model-path DIR` and vLLM load it. DIR must not exist yet: an
export never overwrites one (it is written beside it and renamed into place, so a crash leaves no half). Exit 0
written, 2 bad input (one line on stderr).

`--set drafter.init_from=DIR` (training, `python -m trainer --init-from DIR`) and `trainer.eval --init-from DIR`
start from such a directory, so a published drafter can be evaluated or fine-tuned here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.drafter_format import CONFIG_FILE, LAYOUT, WEIGHTS_FILE, DrafterFormatError, reference_config
from trainer.oneline import first_line

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def drafter_meta(cfg: Any) -> dict[str, Any]:
    """What a checkpoint records beside the weights so an export never has to guess (layout, MASK id, layers)."""
    return {"layout": LAYOUT, "mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.layer_ids),
            "block_size": cfg.drafter.block_size}


def read_exported(directory: str | Path) -> dict[str, torch.Tensor]:
    """DIR/model.safetensors as tensors; a missing, truncated or foreign file is one DrafterFormatError. Callers
    read it before the target loads, so a broken directory fails in a second, not after the target's minutes."""
    from safetensors.torch import load_file

    path = Path(directory) / WEIGHTS_FILE
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise DrafterFormatError(f"{path}: missing (not a drafter directory)") from None
    except Exception as e:  # a truncated or foreign file: safetensors raises its own error types
        raise DrafterFormatError(f"{path}: cannot read ({first_line(e)})") from None


def load_exported(drafter: nn.Module, directory: str | Path,
                  weights: dict[str, torch.Tensor] | None = None) -> None:
    """Load DIR/model.safetensors (or `weights` already read from it) into `drafter`, whose shape the config set
    from DIR/config.json; names or shapes that differ are one DrafterFormatError."""
    path = Path(directory) / WEIGHTS_FILE
    weights = read_exported(directory) if weights is None else weights
    ours = drafter.state_dict()
    missing, extra = sorted(set(ours) - set(weights)), sorted(set(weights) - set(ours))
    if missing or extra:
        raise DrafterFormatError(f"{path}: parameters do not match the reference layout (missing {missing[:3]}, "
                                 f"unexpected {extra[:3]})")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(ours[name].shape):
            raise DrafterFormatError(f"{path}: {name} has shape {tuple(tensor.shape)}, the config says "
                                     f"{tuple(ours[name].shape)}")
    drafter.load_state_dict({k: v.to(ours[k].dtype) for k, v in weights.items()})


def max_positions(cfg: Any) -> int:
    """The target's context length when it is an HF checkpoint (the serving engine sizes rotary tables by it)."""
    if cfg.target.path:
        try:
            return int(json.loads((Path(cfg.target.path) / "config.json").read_text())["max_position_embeddings"])
        except (OSError, KeyError, ValueError, TypeError):
            pass
    return 40960


def export(checkpoint_path: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Write the drafter of a checkpoint to `out` (which must not exist). Returns `out`."""
    from safetensors.torch import save_file

    from trainer.checkpoint import checkpoint_config, read_checkpoint

    out = Path(out)
    if out.exists():
        raise DrafterFormatError(f"{out}: already exists (an export never overwrites; pick a new --out)")
    if not out.parent.is_dir():
        raise DrafterFormatError(f"{out.parent}: no such directory")
    path, state = read_checkpoint(checkpoint_path)
    cfg = checkpoint_config(state)
    config = reference_config(cfg, cfg.target.num_layers, dtype, max_positions(cfg),
                              extra={"checkpoint": str(path), "step": int(state.get("step", 0)),
                                     "target": cfg.target.path or "tiny"})
    weights = {k: v.detach().to(DTYPES[dtype]).contiguous() for k, v in state["drafter"].items()}
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_into(checkpoint_path: str | Path, parent: str | Path, dtype: str) -> tuple[Path, bool]:
    """Export to `parent`/step-NNNNNNNN-<dtype>, or keep that directory when an earlier export wrote it (same
    checkpoint, same dtype: the same bytes). Returns (directory, reused). What `dflashctl export` runs."""
    from trainer.checkpoint import read_checkpoint

    path, state = read_checkpoint(checkpoint_path)
    out = Path(parent) / f"step-{int(state.get('step', 0)):08d}-{dtype}"
    if (out / CONFIG_FILE).is_file() and (out / WEIGHTS_FILE).is_file():
        return out, True
    Path(parent).mkdir(parents=True, exist_ok=True)
    return export(path, out, dtype), False


def manifest(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of each file, so a copy can be checked end to end."""
    import hashlib

    files = {}
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        digest, size = hashlib.sha256(), 0
        with open(directory / name, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        files[name] = {"size": size, "sha256": digest.hexdigest()}
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a run directory (its newest checkpoint) or a step-*.pt file")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="the drafter directory to write (must not exist)")
    where.add_argument("--into", metavar="PARENT",
                       help="write PARENT/step-N-<dtype> (kept as it is when an earlier export wrote it)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                   help="weight dtype in model.safetensors (published drafters are bfloat16)")
    p.add_argument("--json", action="store_true", help="print {out, reused, files: {name: {size, sha256}}}")
    args = p.parse_args(argv)
    from trainer.checkpoint import CheckpointError

    try:
        if args.out:
            out, reused = export(args.checkpoint, args.out, args.dtype), False
        else:
            out, reused = export_into(args.checkpoint, args.into, args.dtype)
        files = manifest(out) if args.json else {}
    except (CheckpointError, DrafterFormatError, OSError) as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"out": str(out), "reused": reused, "files": files}))
    else:
        print(f"{'kept the earlier export' if reused else 'exported'} {out} ({WEIGHTS_FILE}, {CONFIG_FILE}: "
              "DFlashDraftModel)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
