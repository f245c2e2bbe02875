"""Benchmark prompt sets: the shipped files load, prompts are formatted exactly as dflash/benchmark.py does, and both
published field layouts of MBPP and MT-Bench are read; a bad file is one line naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.benchsets import BENCH_DIR, NAMES, BenchError, BenchPrompt, load_bench, load_bench_dir
from trainer.hf_tiny import PROMPTS_DIR, corpus_from_jsonl

# dflash/benchmark.py `DATASETS[...]["format"]`, verbatim: the reference our formatting must equal
REFERENCE = {
    "gsm8k": lambda x: "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.".format(**x),  # noqa: E501
    "math500": lambda x: "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.".format(**x),  # noqa: E501
    "humaneval": lambda x: "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```".format(**x),  # noqa: E501
    "mbpp": lambda x: x["prompt"],
    "mt-bench": lambda x: x["prompt"],
}
COUNTS = {"gsm8k": 5, "math500": 5, "humaneval": 5, "mbpp": 5, "mt-bench": 6}
FIELDS = {  # each published file's field layout
    "gsm8k": {"question", "answer"},
    "math500": {"problem", "solution", "answer", "subject", "level", "unique_id"},
    "humaneval": {"task_id", "prompt", "canonical_solution", "test", "entry_point"},
    "mbpp": {"source_file", "task_id", "prompt", "code", "test_imports", "test_list"},
    "mt-bench": {"prompt", "prompt_id", "category", "reference"},
}


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (BENCH_DIR / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def write(directory: Path, name: str, recs: list, raw: str = "") -> Path:
    path = directory / name
    path.write_text(raw or "".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.mark.parametrize("name", NAMES)
def test_shipped_file_loads_in_the_published_layout(name: str):
    prompts = load_bench(name, BENCH_DIR / f"{name}.jsonl")
    assert len(prompts) == COUNTS[name]
    assert all(set(rec) == FIELDS[name] for rec in records(name))
    for rec, prompt in zip(records(name), prompts, strict=True):
        expected = REFERENCE[name](rec)
        assert prompt.turns == (expected if name == "mt-bench" else [expected])
    assert len({p.source for p in prompts}) == len(prompts)


def test_formatting_strings_are_the_papers(tmp_path: Path):
    gsm, = load_bench("gsm8k", write(tmp_path, "g.jsonl", [{"question": "Q?", "answer": "#### 1"}]))
    assert gsm.turns == ["Q?\nPlease reason step by step, and put your final answer within \\boxed{}."]
    assert "\\boxed{}" in gsm.turns[0] and "\\\\" not in gsm.turns[0]
    he, = load_bench("humaneval", BENCH_DIR / "humaneval.jsonl")[:1]
    head = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
    assert he.turns[0].startswith(head) and he.turns[0].endswith("\n```")
    assert he.source == "humaneval:HumanEval/dflashctl-0"


def test_both_mbpp_layouts(tmp_path: Path):
    sanitized = write(tmp_path, "s.jsonl", [{"task_id": 7, "prompt": "Write a function to add.", "code": ""}])
    full = write(tmp_path, "f.jsonl", [{"task_id": 8, "text": "Write a function to subtract.", "code": "",
                                        "test_list": [], "test_setup_code": "", "challenge_test_list": []}])
    assert load_bench("mbpp", sanitized) == [BenchPrompt(turns=["Write a function to add."], source="mbpp:7")]
    assert load_bench("mbpp", full) == [BenchPrompt(turns=["Write a function to subtract."], source="mbpp:8")]


def test_both_mt_bench_layouts(tmp_path: Path):
    hf = write(tmp_path, "hf.jsonl", [{"prompt": ["a", "b"], "prompt_id": 81, "category": "writing", "reference": []}])
    fastchat = write(tmp_path, "fc.jsonl", [{"question_id": 82, "category": "math", "turns": ["c", "d"]}])
    assert load_bench("mt-bench", hf) == [BenchPrompt(turns=["a", "b"], source="mt-bench:81")]
    assert load_bench("mt-bench", fastchat) == [BenchPrompt(turns=["c", "d"], source="mt-bench:82")]


def test_records_without_an_id_are_numbered(tmp_path: Path):
    path = write(tmp_path, "g.jsonl", [{"question": "one"}, {"question": "two"}])
    assert [p.source for p in load_bench("gsm8k", path)] == ["gsm8k:0", "gsm8k:1"]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("gsm8k", '{"question": "ok"}\n{"problem": "x"}\n', "g.jsonl:2: gsm8k record has no 'question'"),
    ("mbpp", '{"code": "x"}\n', "g.jsonl:1: mbpp record has no 'prompt' or 'text'"),
    ("mt-bench", '{"prompt": "not a list"}\n', "g.jsonl:1: mt-bench record has no 'prompt' or 'turns'"),
    ("mt-bench", '{"turns": []}\n', "g.jsonl:1: mt-bench record has no 'prompt' or 'turns'"),
    ("humaneval", '\n{"prompt": 3}\n', "g.jsonl:2: humaneval record has no 'prompt'"),
    ("math500", '{"problem": \n', "g.jsonl:1: invalid JSON"),
    ("math500", '["problem"]\n', "g.jsonl:1: expected a JSON object"),
    ("gsm8k", "\n\n", "g.jsonl: no records"),
])
def test_bad_file_is_one_line(tmp_path: Path, name: str, content: str, message: str):
    path = write(tmp_path, "g.jsonl", [], raw=content)
    with pytest.raises(BenchError) as err:
        load_bench(name, path)
    text = str(err.value)
    assert "\n" not in text and str(tmp_path) in text and message in text


def test_unknown_name_and_missing_file(tmp_path: Path):
    with pytest.raises(BenchError, match="unknown benchmark 'gsm9k'"):
        load_bench("gsm9k", BENCH_DIR / "gsm8k.jsonl")
    with pytest.raises(BenchError, match="cannot read"):
        load_bench("gsm8k", tmp_path / "absent.jsonl")


def test_load_bench_dir(tmp_path: Path):
    shipped = load_bench_dir(BENCH_DIR)
    assert list(shipped) == list(NAMES) and {k: len(v) for k, v in shipped.items()} == COUNTS
    write(tmp_path, "mbpp.jsonl", [{"prompt": "p"}])
    write(tmp_path, "notes.jsonl", [{"anything": 1}])  # not a set name: ignored
    assert list(load_bench_dir(tmp_path)) == ["mbpp"]
    with pytest.raises(BenchError, match="no benchmark files"):
        load_bench_dir(tmp_path / "empty")


def test_tokenizer_corpus_ignores_the_bench_subdirectory():
    """hf_tiny trains its tokenizer on the top-level prompt files only; the bench sets do not change it."""
    top = [t for f in sorted(PROMPTS_DIR.glob("*.jsonl")) for t in corpus_from_jsonl(f)]
    assert corpus_from_jsonl(PROMPTS_DIR) == top
    assert not any("Please reason step by step" in t for t in top)
