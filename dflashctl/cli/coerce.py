"""Typer's parameter coercion, without pydantic for the plain values our verbs take (issue 16: start fast).

typer ≥ 0.28 coerces every parameter it processes, its own `--help` and `--install-completion` included, through a
pydantic TypeAdapter: importing pydantic costs more than all of `dflashctl version` may take. typer builds that
coercion lazily per parameter (`_TyperParameter.get_runtime_param`); `install` gives each parameter a coercion that
takes the common, unambiguous values itself (a flag's bool, a str, a plain decimal int or float within its bounds, a
Path, lists of these) and hands anything else to typer's own pydantic coercion, so that odd values, bad values and
their error messages stay exactly typer's. A typer without that machinery (≤ 0.27 has no pydantic) is left as is;
tests/cli/test_startup_imports.py fails if a typer upgrade brings pydantic back onto the path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

from typer import core as typer_core
from typer._click import Context

try:  # typer ≥ 0.28 (pydantic coercion)
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # pragma: no cover - an older typer coerces without pydantic already
    RuntimeParam = None

_NO = object()  # "not a value this module takes": typer's own coercion decides
_MAX_DIGITS = 18  # longer numbers go to typer (pydantic limits digits; int() would not)


def _digits(text: str) -> bool:
    """A plain ASCII decimal integer: no sign, no leading zero, no underscores or blanks (those go to typer)."""
    return 0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit() and (text == "0" or text[0] != "0")


def _int_text(text: str) -> bool:
    return _digits(text[1:] if text.startswith("-") else text)


def _float_text(text: str) -> bool:
    whole, dot, frac = text.partition(".")
    return _int_text(whole) and (not dot or (frac.isascii() and frac.isdigit() and len(frac) <= _MAX_DIGITS))


def _in_bounds(x: float, info: Any) -> bool:
    """Out of bounds goes to typer: its error message, or its clamp."""
    return (info.min is None or x >= info.min) and (info.max is None or x <= info.max)


def _number(annotation: type, info: Any, value: Any) -> Any:
    if annotation is int:
        x = value if type(value) is int else int(value) if type(value) is str and _int_text(value) else _NO
    elif type(value) in (int, float):
        x = float(value)
    else:
        x = float(value) if type(value) is str and _float_text(value) else _NO
    return x if x is not _NO and _in_bounds(x, info) else _NO


def _leaf(annotation: Any, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    if annotation is bool:
        return value if type(value) is bool else _NO
    if annotation is str:
        return value if type(value) is str else _NO
    if annotation in (int, float):
        return _number(annotation, info, value)
    if annotation is Path and info.path_type is None:
        if type(value) is str and value:
            value = Path(value)
        # typer's own path checks (exists, file_okay, resolve_path, ...), given the Path pydantic would have made
        return coerce_cli_path(value, info, path_type=Path, param=param, ctx=ctx) if isinstance(value, Path) else _NO
    return _NO


def _value(annotation: Any, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    if info.parser is not None:
        return _NO
    if get_origin(annotation) is list:
        (item_type,) = get_args(annotation)
        values = value if isinstance(value, (list, tuple)) else [value]
        items = [_leaf(item_type, info, v, param, ctx) for v in values]
        return _NO if any(x is _NO for x in items) else items
    return _leaf(annotation, info, value, param, ctx)


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class LeanParam(RuntimeParam):
        """One parameter's coercion: the plain values here, the rest by typer's (pydantic) coercion."""

        descriptor: TypeDescriptor

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            got = _value(self.annotation, self.parameter_info, value, param, ctx)
            if got is not _NO:
                return got
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)


def install(command: Any) -> int:
    """Give every typer parameter of `command` and its subcommands the lean coercion; returns how many got it."""
    if RuntimeParam is None:
        return 0
    # click makes each command's --help option on first use: make it now (cached on the command, the names its
    # contexts inherit from the root's context_settings) so that it gets the lean coercion too
    ctx = Context(command, help_option_names=command.context_settings.get("help_option_names"))
    n, todo = 0, [command]
    while todo:
        cmd = todo.pop()
        help_option = cmd.get_help_option(ctx)
        for p in [*cmd.params, *([help_option] if help_option is not None else [])]:
            if (isinstance(p, typer_core._TyperParameter) and getattr(p, "_runtime_param", None) is None
                    and p.type_descriptor.file_annotation is None):
                d = p.type_descriptor
                p._runtime_param = LeanParam(parameter_info=d.parameter_info, annotation=d.annotation, descriptor=d)
                n += 1
        todo.extend(getattr(cmd, "commands", {}).values())
    return n
