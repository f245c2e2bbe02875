"""One typed config for the trainer: TOML file + `--set section.key=value` overrides, validated up front.

Every field has a default; the TOML file only names what differs. Unknown sections/keys and bad values raise
`ConfigError`, which `__main__` prints as one line naming the file and the key (exit 2) — a typo must never turn
into a silently ignored setting or a traceback minutes into a run.

The sections and their defaults are trainer/config_schema.py, the cross-field checks trainer/config_validate.py;
this module reads a file (or a checkpoint's dict) into them, and every config name is importable from here.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from trainer.config_schema import (
    Config,
    ConfigError,
    DataConfig,
    DevicesConfig,
    DrafterConfig,
    EvalConfig,
    RuntimeConfig,
    TargetConfig,
    TrainConfig,
    spread_layers,
)
from trainer.config_validate import validate

__all__ = ["Config", "ConfigError", "DataConfig", "DevicesConfig", "DrafterConfig", "EvalConfig", "RuntimeConfig",
           "TargetConfig", "TrainConfig", "config_from_dict", "load_config", "spread_layers", "validate"]


def _coerce(value: Any, default: Any, where: str) -> Any:
    """Check/convert one value against the default's type (int accepted for float, nothing else widened)."""
    is_num = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok, value = is_num, float(value) if is_num else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ConfigError(f"{where}: expected {type(default).__name__}, got {type(value).__name__} {value!r}")
    return list(value) if isinstance(value, list) else value


def _parse_override(text: str, default: Any) -> Any:
    """`--set` values are typed by the default: `50` for ints, `true` for bools, TOML syntax for lists."""
    if isinstance(default, str):
        return text
    if isinstance(default, bool):
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply(cfg: Config, section: str, key: str, value: Any, where: str) -> None:
    sub = getattr(cfg, section, None)
    if sub is None or not dataclasses.is_dataclass(sub):
        raise ConfigError(f"{where}: unknown section [{section}]")
    names = {f.name for f in dataclasses.fields(sub)}
    if key not in names:
        raise ConfigError(f"{where}: unknown key '{section}.{key}'")
    setattr(sub, key, _coerce(value, getattr(sub, key), where))


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read TOML (if given), apply `section.key=value` overrides, validate. Raises ConfigError."""
    cfg = Config()
    name = str(path) if path else "<defaults>"
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{name}: file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{name}: cannot read ({e})") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{name}: invalid TOML ({e})") from None
        for section, body in data.items():
            if not isinstance(body, dict):
                raise ConfigError(f"{name}: key '{section}': expected a [{section}] table")
            for key, value in body.items():
                _apply(cfg, section, key, value, f"{name}: key '{section}.{key}'")
    for item in overrides:
        where = f"{name}: override '{item}'"
        dotted, sep, text = item.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not sep or not dot:
            raise ConfigError(f"{where}: expected section.key=value")
        sub = getattr(cfg, section, None)
        default = getattr(sub, key, None) if dataclasses.is_dataclass(sub) else None
        _apply(cfg, section, key, _parse_override(text.strip(), default), where)
    validate(cfg, name)
    return cfg



def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config saved in a checkpoint (`Config.to_dict()`; unknown keys from other versions ignored)."""
    cfg = Config()
    for section, body in data.items():
        sub = getattr(cfg, section, None)
        if not dataclasses.is_dataclass(sub) or not isinstance(body, dict):
            continue
        names = {f.name for f in dataclasses.fields(sub)}
        for key, value in body.items():
            if key in names:
                setattr(sub, key, value)
    return cfg
