"""The drafter directory format the DFlash ecosystem loads, as data: config.json <-> our config. No torch here.

A drafter directory is what the paper authors' `dflash` package (0.1.0, `DFlashDraftModel.from_pretrained`),
SGLang (`--speculative-draft-model-path`) and vLLM read: a Qwen3-style `config.json` with the DFlash keys, and
`model.safetensors` with the drafter's own weights (no embedding or LM head: those are the target's). The keys
the reference reads (dflash/model.py): the Qwen3Config dimensions, `head_dim`, `num_target_layers`,
`block_size`, and `dflash_config: {mask_token_id, target_layer_ids}` (it looks in `dflash_config` first, then
at the top level; we write both for block_size, which published drafters keep in either place).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LAYOUT = "dflash-reference-1"
"""Recorded in trainer checkpoints: the parameter layout of the reference DFlashDraftModel (q_norm/k_norm,
`layers.N.self_attn.q_proj`, ...). Checkpoints without it come from the layout before and cannot be loaded."""
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


class DrafterFormatError(ValueError):
    """A drafter directory or checkpoint that cannot be used; the message says which file and why."""


def reference_config(cfg: Any, num_target_layers: int, dtype: str, max_positions: int = 40960,
                     extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json for a drafter trained under `cfg` (a trainer Config whose target dims are synced)."""
    t, d = cfg.target, cfg.drafter
    head_dim = d.head_dim or t.head_dim or t.hidden_size // d.num_heads
    out = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t.hidden_size,
        "intermediate_size": d.intermediate_size,
        "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": d.num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": t.rms_eps,
        "rope_theta": t.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": t.rope_theta},
        "max_position_embeddings": max_positions,
        "vocab_size": t.vocab_size,
        "attention_bias": d.attention_bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * d.num_layers,
        "num_target_layers": t.num_layers,
        "block_size": d.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.layer_ids),
                          "block_size": d.block_size},
        "dtype": dtype,
    }
    if extra:
        out["dflashctl"] = extra
    return out


def _get(cfg: dict[str, Any], key: str, default: Any = None) -> Any:
    """The reference's `_draft_value`: dflash_config first, then the top level."""
    sub = cfg.get("dflash_config") or {}
    return sub.get(key, cfg.get(key, default)) if isinstance(sub, dict) else cfg.get(key, default)


def spread_reference(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference's `build_target_layer_ids` (used when a config names no target_layer_ids)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def read_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_FILE
    if not Path(directory).is_dir():
        raise DrafterFormatError(f"{directory}: not a directory (expected a drafter with {CONFIG_FILE} and "
                                 f"{WEIGHTS_FILE})")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DrafterFormatError(f"{path}: missing (not a drafter directory)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise DrafterFormatError(f"{path}: cannot read ({e})") from None
    if not isinstance(data, dict):
        raise DrafterFormatError(f"{path}: expected a JSON object")
    return data


def drafter_settings(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """From a reference config.json: the DrafterConfig fields, the target layer ids and the target dims it fixes.

    Returns {"drafter": {...}, "layer_ids": [...], "hidden_size": H, "vocab_size": V, "rope_theta": x,
    "rms_eps": e, "num_target_layers": L}; a missing key or an unsupported feature is one error naming it."""
    arch = cfg.get("architectures") or []
    if arch and "DFlashDraftModel" not in arch:
        raise DrafterFormatError(f"{where}: architectures {arch} is not DFlashDraftModel (DFlash 2's selector and "
                                 "convolutions are not supported)")
    layer_types = cfg.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types) or cfg.get("is_causal"):
        raise DrafterFormatError(f"{where}: sliding-window or causal drafter layers are not supported "
                                 f"(layer_types {sorted(set(layer_types))})")
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        params = cfg.get("rope_parameters") or {}
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        if (params.get("rope_type") or "default") != "default" or cfg.get("rope_scaling"):
            raise DrafterFormatError(f"{where}: rope scaling {params.get('rope_type') or cfg.get('rope_scaling')} "
                                     "is not supported (default rotary only)")
        layer_ids = _get(cfg, "target_layer_ids")
        if layer_ids is None:
            layer_ids = spread_reference(int(cfg["num_target_layers"]), layers)
        mask = _get(cfg, "mask_token_id")
        if mask is None:
            raise KeyError("dflash_config.mask_token_id")
        return {
            "drafter": {
                "num_layers": layers,
                "block_size": int(_get(cfg, "block_size", 16)),
                "num_heads": heads,
                "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
                "intermediate_size": int(cfg["intermediate_size"]),
                "head_dim": int(cfg.get("head_dim") or hidden // heads),
                "mask_token_id": int(mask),
                "attention_bias": bool(cfg.get("attention_bias", False)),
            },
            "layer_ids": [int(i) for i in layer_ids],
            "hidden_size": hidden,
            "vocab_size": int(cfg.get("vocab_size") or 0),
            "rope_theta": theta,
            "rms_eps": float(cfg.get("rms_norm_eps", 1e-6)),
            "num_target_layers": int(cfg.get("num_target_layers") or 0),
        }
    except KeyError as e:
        raise DrafterFormatError(f"{where}: missing key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, DrafterFormatError):
            raise
        raise DrafterFormatError(f"{where}: bad value ({e})") from None


def apply_init_from(cfg: Any, directory: str) -> None:
    """Make `cfg` describe the drafter in `directory` (shape, block size, MASK id, target layers) and check it fits
    the target. Called by config validation, before torch: a drafter for another target fails in milliseconds."""
    where = str(Path(directory) / CONFIG_FILE)
    found = drafter_settings(read_config(directory), where)
    t = cfg.target
    for key, ours in (("hidden_size", t.hidden_size), ("rope_theta", t.rope_theta)):
        if found[key] != ours:
            raise DrafterFormatError(f"{where}: {key} {found[key]} does not match the target's {ours} (a drafter "
                                     "for another target)")
    if found["num_target_layers"] and found["num_target_layers"] != t.num_layers:
        raise DrafterFormatError(f"{where}: num_target_layers {found['num_target_layers']} but the target has "
                                 f"{t.num_layers} layers")
    if any(not 0 <= i < t.num_layers for i in found["layer_ids"]):
        raise DrafterFormatError(f"{where}: target_layer_ids {found['layer_ids']} outside the target's "
                                 f"{t.num_layers} layers")
    for key, value in found["drafter"].items():
        setattr(cfg.drafter, key, value)
    t.layer_ids = found["layer_ids"]
