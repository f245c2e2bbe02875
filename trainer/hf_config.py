"""Read a Hugging Face checkpoint's config.json without importing torch or transformers.

The trainer's config is validated before any heavy import (a typo must fail in milliseconds), and the target's
dimensions (layers for the captured-layer spread, hidden size for the drafter's heads) live in the checkpoint,
not in the TOML. This module turns config.json into `TargetConfig` field values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "qwen2")


class HFConfigError(ValueError):
    """The directory is not a loadable checkpoint of a supported family; the message says why."""


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """config.json of a local checkpoint directory as a dict (never touches the network)."""
    if not Path(path).is_dir():
        raise HFConfigError(f"{path}: not a directory (expected a local Hugging Face checkpoint)")
    return read_json_object(Path(path) / "config.json", HFConfigError,
                            missing=f"{path}: no config.json (expected a local Hugging Face checkpoint)")


def read_json_object(path: Path, error: type[Exception], *, missing: str) -> dict[str, Any]:
    """A JSON object from a file, every failure as one `error(message)` (the CLI prints it as one line)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise error(missing) from None
    except (OSError, json.JSONDecodeError) as e:
        raise error(f"{path}: cannot read ({e})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object")
    return data


def rope_theta(cfg: dict[str, Any]) -> float:
    """transformers < 5 writes `rope_theta`; 5.x writes `rope_parameters: {rope_theta: ...}`."""
    params = cfg.get("rope_parameters") or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(cfg.get("rope_theta", 10000.0))


def target_dims(path: str | Path) -> dict[str, Any]:
    """The `TargetConfig` fields a checkpoint determines (vocab, hidden size, layers, heads, rope, eps)."""
    cfg = read_hf_config(path)
    kind = cfg.get("model_type", "")
    if kind not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(SUPPORTED_MODEL_TYPES)
        raise HFConfigError(f"{path}: model_type {kind!r} is not supported (supported: {supported})")
    try:
        heads = int(cfg["num_attention_heads"])
        return {
            "vocab_size": int(cfg["vocab_size"]),
            "hidden_size": int(cfg["hidden_size"]),
            "num_layers": int(cfg["num_hidden_layers"]),
            "num_heads": heads,
            "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
            "intermediate_size": int(cfg["intermediate_size"]),
            "rope_theta": rope_theta(cfg),
            "rms_eps": float(cfg.get("rms_norm_eps", 1e-6)),
            "head_dim": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            "model_type": kind,
        }
    except KeyError as e:
        raise HFConfigError(f"{path}/config.json: missing key {e.args[0]!r}") from None
