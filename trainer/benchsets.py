"""Benchmark prompt sets in their published JSONL layouts, formatted into prompts as the DFlash paper's benchmark does.

The paper's benchmark (the `dflash` package, dflash/benchmark.py, `DATASETS`) decodes GSM8K, MATH-500, HumanEval,
MBPP and MT-Bench; `FORMATS` below renders each record exactly as its `format` lambdas do. The real files are
converted from the Hugging Face datasets (docs/trainer.md, "Benchmark prompt sets"); trainer/prompts/bench/ ships a
few prompts of each shape written for this project, in the same field layout, for tests and CPU runs.

    load_bench("gsm8k", "trainer/prompts/bench/gsm8k.jsonl") -> [BenchPrompt(turns=[...], source="gsm8k:0"), ...]
    load_bench_dir("trainer/prompts/bench") -> {"gsm8k": [...], "math500": [...], ...}  (every <name>.jsonl present)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.jsonl import jsonl_objects

BENCH_DIR = Path(__file__).parent / "prompts" / "bench"
REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_HEAD = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"


class BenchError(Exception):
    """A benchmark file that cannot be used; the message is one line naming the file (and line)."""


@dataclass(frozen=True)
class BenchPrompt:
    turns: list[str]
    """The user turns, in order (one except for MT-Bench); the model answers each before the next is sent."""
    source: str
    """`name:id`: the record's own id (task_id, unique_id, prompt_id, question_id) or else its 0-based index."""


def _text(rec: dict[str, Any], *fields: str) -> str:
    """The first of `fields` present; KeyError (naming them) when none is a non-empty string."""
    for f in fields:
        if isinstance(rec.get(f), str) and rec[f]:
            return rec[f]
    raise KeyError(" or ".join(repr(f) for f in fields) + " (a non-empty string)")


def _turns(rec: dict[str, Any]) -> list[str]:
    """MT-Bench: `prompt` (HuggingFaceH4/mt_bench_prompts) or `turns` (FastChat's question.jsonl)."""
    for f in ("prompt", "turns"):
        value = rec.get(f)
        if isinstance(value, list) and value and all(isinstance(t, str) and t for t in value):
            return list(value)
    raise KeyError("'prompt' or 'turns' (a non-empty list of strings)")


FORMATS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "gsm8k": lambda r: [_text(r, "question") + REASON],
    "math500": lambda r: [_text(r, "problem") + REASON],
    "humaneval": lambda r: [HUMANEVAL_HEAD + _text(r, "prompt") + "\n```"],
    "mbpp": lambda r: [_text(r, "prompt", "text")],  # sanitized has `prompt`, the original (full) set `text`
    "mt-bench": _turns,
}
"""Each set's record -> user turns, as dflash/benchmark.py formats them."""
ID_FIELDS = ("task_id", "unique_id", "prompt_id", "question_id")
NAMES = tuple(FORMATS)


def load_bench(name: str, path: str | Path) -> list[BenchPrompt]:
    """Every record of the JSONL at `path` formatted as set `name`; BenchError on the first bad line."""
    if name not in FORMATS:
        raise BenchError(f"unknown benchmark {name!r} (known: {', '.join(NAMES)})")
    path = Path(path)
    prompts = []
    for where, rec in jsonl_objects(path, BenchError):
        try:
            turns = FORMATS[name](rec)
        except KeyError as e:
            raise BenchError(f"{where}: {name} record has no {e.args[0]}") from None
        ident = next((rec[f] for f in ID_FIELDS if isinstance(rec.get(f), str | int)), len(prompts))
        prompts.append(BenchPrompt(turns=turns, source=f"{name}:{ident}"))
    if not prompts:
        raise BenchError(f"{path}: no records")
    return prompts


def load_bench_dir(directory: str | Path = BENCH_DIR) -> dict[str, list[BenchPrompt]]:
    """`<name>.jsonl` of every known set present in `directory`, by name (in NAMES order); BenchError if none."""
    directory = Path(directory)
    found = {name: load_bench(name, directory / f"{name}.jsonl") for name in NAMES
             if (directory / f"{name}.jsonl").is_file()}
    if not found:
        raise BenchError(f"{directory}: no benchmark files (expected one of "
                         f"{', '.join(n + '.jsonl' for n in NAMES)})")
    return found
