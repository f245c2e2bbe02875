"""diagnose on the real-log corpus (tests/analysis/data/real/), beside the 16 greps an engineer writes by hand.

    .venv/bin/python benchmarks/diagnose_corpus.py [--corpus DIR] [--misses] [--json] [--out FILE]

A case is `<stem>.log` (copied verbatim from a public GitHub issue) + `<stem>.json` (what a careful engineer
concludes from it); the format and the label rules are in tests/analysis/data/real/README.md. `--corpus DIR`
scores a held-out corpus of the same format the same way. Prints the table, writes it to
benchmarks/results/diagnose_corpus.md (or `--out`) with the date, the corpus size and the command; `--misses`
adds, per case, each column the engine got wrong (want vs got, with the evidence line of every extra label);
`--json` prints the same record as JSON instead of the table. Always exits 0: it measures, it does not judge
(tests/analysis/test_real_corpus.py asserts the issue's figures with this module's scoring).

Engine: `dflashctl.commands.diagnose.diagnose([log], [])`, then from `.health`: labels = the hits' signature
ids, final exception = `final_exception`, workers = the names of threads in state "crashed", root cause =
`root_cause` (None while Health has no such field), last step / total = `progress["step"]` / `["total"]`.

Baseline: the real `grep -E -n -a` binary (LC_ALL=C; `-a` so a stray NUL byte cannot turn a log into
"Binary file matches"), one call per pattern per case. The 16 patterns and what each one's hits mean:

     1  `Traceback|Error:|Exception`         final exception: the type at the start of the LAST hit that looks
                                             like `Type: message` (after any `[rank0]:`-style prefixes; the type
                                             ends in Error, Exception, Interrupt or Exit)
     2  `CUDA out of memory`                 label cuda-oom
     3  `Killed`                             label host-oom
     4  `NCCL`                               label nccl-error
     5  `[Tt]imeout|timed out`               label nccl-timeout
     6  `illegal memory access|device-side assert`   label cuda-illegal-access
     7  `Xid`                                label gpu-hardware
     8  `nan`                                label nan-loss
     9  `No space left`                      label disk-full
    10  `ModuleNotFoundError|ImportError`    label import-error
    11  `DataLoader worker`                  label dataloader-worker
    12  `Segmentation fault`                 label segfault
    13  `Exception in thread`                worker: the NAME of `Exception in thread NAME:`
    14  `\\[rank[0-9]+\\]`                     worker: `rankN` for a `[rankN]:` prefix on a line that says Error
    15  `step[=: ][0-9]+`                    last step: N of the last `step=N` / `step: N` / `step N`
    16  `[0-9]+/[0-9]+ \\[`                    last step: N (total: M) of the last `N/M [` (a tqdm bar)

A label is predicted when its pattern hits at all; root cause = the first worker in log order; the last step is
the right-most match on the last line that 15 or 16 hit (the total only when that match is a bar).

Columns (micro ratios; "n/a" where nothing is counted): label recall and precision over all (case, id) pairs;
final exception exact (None == None counts); crashed workers named (expected names found, plus the count of
extra names); root cause correct (over cases that have one); last step and bar total exact (over all cases,
null == null counts); clean negatives (healthy cases predicted with no label, no final exception and no crashed
worker, over healthy cases); wall time for the whole corpus (engine: the diagnose calls; grep: the 16 calls and
reading their output, so mostly 16 process starts per case). Numbers are from one run on one machine; compare
the ratios, not the seconds. With `--corpus`, pass `--out` too to keep the main corpus's table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dflashctl.commands.diagnose import diagnose  # noqa: E402

CORPUS = ROOT / "tests" / "analysis" / "data" / "real"
OUT = ROOT / "benchmarks" / "results" / "diagnose_corpus.md"
REQUIRED_KEYS: dict[str, tuple[type, ...]] = {  # key → the JSON types it may hold (NoneType: null)
    "source": (str,), "kind": (str,), "healthy": (bool,), "labels": (list,), "final_exception": (str, type(None)),
    "workers": (list,), "root_cause": (str, type(None)), "last_step": (int, type(None)), "total": (int, type(None)),
}
KINDS = ("hf-trainer", "deepspeed", "torchrun", "accelerate", "lightning", "plain-threads", "plain-script",
         "torch-compile", "nccl", "kernel", "specforge", "nanogpt", "torchtitan", "other")
SOURCE_RE = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+(?:#[\w-]+)?")
TARGETS = {  # what the issue demands of the engine (tests/analysis/test_real_corpus.py asserts the same)
    "label_recall": 0.9, "label_precision": 0.95, "final_exception": 0.9, "workers_found": 1.0, "last_step": 0.9,
    "clean_negatives": 1.0,
}

FINAL, THREAD, RANK, STEP, BAR = "final exception", "thread", "rank", "step", "bar"  # roles that are not ids
GREP_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"Traceback|Error:|Exception", FINAL),
    (r"CUDA out of memory", "cuda-oom"),
    (r"Killed", "host-oom"),
    (r"NCCL", "nccl-error"),
    (r"[Tt]imeout|timed out", "nccl-timeout"),
    (r"illegal memory access|device-side assert", "cuda-illegal-access"),
    (r"Xid", "gpu-hardware"),
    (r"nan", "nan-loss"),
    (r"No space left", "disk-full"),
    (r"ModuleNotFoundError|ImportError", "import-error"),
    (r"DataLoader worker", "dataloader-worker"),
    (r"Segmentation fault", "segfault"),
    (r"Exception in thread", THREAD),
    (r"\[rank[0-9]+\]", RANK),
    (r"step[=: ][0-9]+", STEP),
    (r"[0-9]+/[0-9]+ \[", BAR),
)
_PREFIX_RE = re.compile(r"(?:\s*\[[^\]\n]*\]:?)*\s*")  # `[rank0]: `, `[default3]:`, `[2024-01-01 …] `
_EXC_RE = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)):(?:\s|$)")
_THREAD_RE = re.compile(r"Exception in thread ([^:\r\n]+)")
_RANK_RE = re.compile(r"\[rank([0-9]+)\]:")
_STEP_RE = re.compile(r"step[=: ]([0-9]+)")
_BAR_RE = re.compile(r"([0-9]+)/([0-9]+) \[")


# -- the corpus -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One log and what the judge expects of it (the .json as written)."""

    stem: str
    log: Path
    doc: Mapping[str, Any]

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(self.doc["labels"])

    @property
    def workers(self) -> frozenset[str]:
        return frozenset(self.doc["workers"])

    @property
    def healthy(self) -> bool:
        return bool(self.doc["healthy"])


def doc_problems(doc: Any) -> list[str]:
    """Why a .json cannot be scored: not an object, a required key missing or of the wrong type."""
    if not isinstance(doc, dict):
        return [f"not a JSON object but {type(doc).__name__}"]
    out = []
    for key, types in REQUIRED_KEYS.items():
        if key not in doc:
            out.append(f"no `{key}`")
        elif not isinstance(doc[key], types) or (isinstance(doc[key], bool) and bool not in types):
            out.append(f"`{key}` is {json.dumps(doc[key])}, not {'/'.join(_json_type(t) for t in types)}")
    for key in ("labels", "workers"):
        if isinstance(doc.get(key), list) and not all(isinstance(x, str) for x in doc[key]):
            out.append(f"`{key}` holds a non-string")
    return out


def _json_type(t: type) -> str:
    return {str: "string", bool: "bool", list: "list", int: "int", type(None): "null"}[t]


def load_corpus(folder: Path) -> tuple[list[Case], list[str]]:
    """The scorable cases, sorted by stem, and a line per file that could not be scored (and why)."""
    cases, problems = [], []
    logs = {p.stem: p for p in folder.glob("*.log")}
    docs = {p.stem: p for p in folder.glob("*.json")}
    for stem in sorted(docs.keys() - logs.keys()):
        problems.append(f"{stem}.json: no {stem}.log beside it")
    for stem in sorted(logs):
        if stem not in docs:
            problems.append(f"{stem}.log: no {stem}.json beside it")
            continue
        try:
            doc = json.loads(docs[stem].read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            problems.append(f"{stem}.json: unreadable ({e})")
            continue
        why = doc_problems(doc)
        if why:
            problems.append(f"{stem}.json: " + "; ".join(why))
            continue
        cases.append(Case(stem, logs[stem], doc))
    return cases, problems


# -- predictions --------------------------------------------------------------------------------------------


@dataclass
class Prediction:
    """What a method says about one log. error: it raised (everything else is then empty)."""

    labels: frozenset[str] = frozenset()
    final_exception: str | None = None
    workers: frozenset[str] = frozenset()
    root_cause: str | None = None
    last_step: int | float | None = None
    total: int | float | None = None
    evidence: dict[str, str] = field(default_factory=dict)  # label id → "line N: text" (for --misses)
    error: str | None = None
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.labels and self.final_exception is None and not self.workers


def _num(v: Any) -> int | float | None:
    """Steps compare as ints when both are numbers (the engine keeps progress values as floats)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None if v is None else v
    return int(v) if float(v).is_integer() else float(v)


def engine_predict(log: Path) -> Prediction:
    t0 = time.perf_counter()
    try:
        h = diagnose([log], []).health
    except Exception as e:  # one log the engine cannot read is one wrong row, not a lost benchmark
        return Prediction(error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    return Prediction(
        labels=frozenset(x.signature.id for x in h.hits),
        final_exception=h.final_exception,
        workers=frozenset(t.name for t in h.threads if t.state == "crashed"),
        root_cause=getattr(h, "root_cause", None),
        last_step=_num(h.progress.get("step")),
        total=_num(h.progress.get("total")),
        evidence={x.signature.id: f"line {x.line}: {x.text}" for x in h.hits},
        seconds=seconds,
    )


def _grep(pattern: str, log: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line the real grep -E prints for one pattern."""
    res = subprocess.run(["grep", "-E", "-n", "-a", "-e", pattern, str(log)], capture_output=True,
                         env={**os.environ, "LC_ALL": "C"}, check=False)
    if res.returncode > 1:
        raise RuntimeError(f"grep -E {pattern!r} exited {res.returncode}: {res.stderr.decode(errors='replace')}")
    out = []
    for raw in res.stdout.split(b"\n"):
        no, sep, text = raw.partition(b":")
        if sep:
            out.append((int(no), text.decode("utf-8", "replace")))
    return out


def grep_predict(log: Path) -> Prediction:
    t0 = time.perf_counter()
    try:
        hits = [(role, _grep(pattern, log)) for pattern, role in GREP_PATTERNS]
    except (OSError, RuntimeError) as e:
        return Prediction(error=str(e), seconds=time.perf_counter() - t0)
    labels: dict[str, str] = {}
    final, workers, steps = None, [], []
    for role, lines in hits:
        if role not in (FINAL, THREAD, RANK, STEP, BAR) and lines:
            labels[role] = f"line {lines[0][0]}: {lines[0][1]}"
        for no, text in lines:
            if role == FINAL:
                m = _EXC_RE.match(text, _PREFIX_RE.match(text).end())
                if m:
                    final = m.group(1)  # the hits come in line order: the last one wins
            elif role == THREAD:
                workers += [(no, m.start(), m.group(1).strip()) for m in _THREAD_RE.finditer(text)]
            elif role == RANK and "Error" in text:
                workers += [(no, m.start(), f"rank{m.group(1)}") for m in _RANK_RE.finditer(text)]
            elif role == STEP:
                steps += [(no, m.start(), int(m.group(1)), None) for m in _STEP_RE.finditer(text)]
            elif role == BAR:
                steps += [(no, m.start(), int(m.group(1)), int(m.group(2))) for m in _BAR_RE.finditer(text)]
    last = max(steps, key=lambda s: s[:2], default=None)
    workers.sort()
    return Prediction(
        labels=frozenset(labels), final_exception=final, workers=frozenset(w for _, _, w in workers),
        root_cause=workers[0][2] if workers else None, last_step=last[2] if last else None,
        total=last[3] if last else None, evidence=labels, seconds=time.perf_counter() - t0,
    )


def predict_all(cases: Sequence[Case], predict: Callable[[Path], Prediction]) -> dict[str, Prediction]:
    return {c.stem: predict(c.log) for c in cases}


# -- scoring (the benchmark's table and the test's thresholds both come from here) ------------------------


@dataclass(frozen=True)
class Ratio:
    hit: int
    of: int

    @property
    def value(self) -> float | None:
        return self.hit / self.of if self.of else None

    def __str__(self) -> str:
        return "n/a (0/0)" if self.value is None else f"{self.value:.2f} ({self.hit}/{self.of})"


COLUMNS = ("labels", "final_exception", "workers", "root_cause", "last_step", "total")  # as --misses names them


@dataclass(frozen=True)
class Judged:
    """One case's prediction judged on every column. None: the column does not apply to this case."""

    labels_found: int
    labels_wanted: int
    labels_given: int
    final_exception: bool
    workers_found: int
    workers_wanted: int
    workers_extra: int
    root_cause: bool | None
    last_step: bool
    total: bool
    clean: bool | None

    def wrong(self) -> list[str]:
        """The columns this case got wrong, in table order."""
        out = []
        if self.labels_found < self.labels_wanted or self.labels_given > self.labels_found:
            out.append("labels")
        if not self.final_exception:
            out.append("final_exception")
        if self.workers_found < self.workers_wanted or self.workers_extra:
            out.append("workers")
        for col in ("root_cause", "last_step", "total"):
            if getattr(self, col) is False:
                out.append(col)
        return out


def judge(case: Case, p: Prediction) -> Judged:
    d = case.doc
    return Judged(
        labels_found=len(case.labels & p.labels), labels_wanted=len(case.labels), labels_given=len(p.labels),
        final_exception=d["final_exception"] == p.final_exception,
        workers_found=len(case.workers & p.workers), workers_wanted=len(case.workers),
        workers_extra=len(p.workers - case.workers),
        root_cause=None if d["root_cause"] is None else d["root_cause"] == p.root_cause,
        last_step=_num(d["last_step"]) == _num(p.last_step), total=_num(d["total"]) == _num(p.total),
        clean=p.clean if case.healthy else None,
    )


@dataclass(frozen=True)
class Figures:
    label_recall: Ratio
    label_precision: Ratio
    final_exception: Ratio
    workers_found: Ratio
    workers_extra: int
    root_cause: Ratio
    last_step: Ratio
    total: Ratio
    clean_negatives: Ratio
    wall_s: float


def score(cases: Sequence[Case], preds: Mapping[str, Prediction]) -> Figures:
    js = [judge(c, preds[c.stem]) for c in cases]

    def count(col: str) -> Ratio:
        vals = [getattr(j, col) for j in js if getattr(j, col) is not None]
        return Ratio(sum(vals), len(vals))

    return Figures(
        label_recall=Ratio(sum(j.labels_found for j in js), sum(j.labels_wanted for j in js)),
        label_precision=Ratio(sum(j.labels_found for j in js), sum(j.labels_given for j in js)),
        final_exception=count("final_exception"),
        workers_found=Ratio(sum(j.workers_found for j in js), sum(j.workers_wanted for j in js)),
        workers_extra=sum(j.workers_extra for j in js),
        root_cause=count("root_cause"), last_step=count("last_step"), total=count("total"),
        clean_negatives=count("clean"),
        wall_s=sum(preds[c.stem].seconds for c in cases),
    )


# -- misses ---------------------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, (set, frozenset, list, tuple)):
        return "[" + ", ".join(sorted(map(str, v))) + "]"
    return str(_num(v) if isinstance(v, float) else v)


def _clip(text: str, n: int = 110) -> str:
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text).replace("\r", "\\r").strip()
    return text if len(text) <= n else text[: n - 1] + "…"


def case_diff(case: Case, p: Prediction, columns: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each column this case got wrong (only `columns`, when given): want, got, and for labels the evidence
    line of every extra id. `raised` when the method raised. Empty: every asked-for column right."""
    cols = None if columns is None else set(columns)
    out: dict[str, dict[str, Any]] = {}
    if p.error is not None:
        out["raised"] = {"want": None, "got": p.error}
    for col in judge(case, p).wrong():
        if cols is not None and col not in cols:
            continue
        want, got = (case.doc[col], getattr(p, col)) if col not in ("labels", "workers") else (
            getattr(case, col), getattr(p, col))
        out[col] = {"want": _jsonable(want), "got": _jsonable(got)}
        if col == "labels" and p.labels - case.labels:
            out[col]["evidence"] = {x: _clip(p.evidence.get(x, "?"), 80) for x in sorted(p.labels - case.labels)}
    return out


def _jsonable(v: Any) -> Any:
    return sorted(v) if isinstance(v, (set, frozenset)) else _num(v) if isinstance(v, float) else v


def case_misses(case: Case, p: Prediction, columns: Iterable[str] | None = None) -> list[str]:
    """The lines `--misses` prints for one case (empty when it got every asked-for column right)."""
    diff = case_diff(case, p, columns)
    if not diff:
        return []
    d = case.doc
    out = [f"{case.stem} [{d['kind']}{', healthy' if case.healthy else ''}] {d['source']}"]
    if d.get("note"):
        out.append(f"  {'note':<16} {_clip(str(d['note']))}")
    for col, v in diff.items():
        if col == "raised":
            out.append(f"  {col:<16} {_clip(v['got'])}")
            continue
        why = "; ".join(f"{x} @ {line}" for x, line in v.get("evidence", {}).items())
        out.append(f"  {col:<16} want {_fmt(v['want'])}  got {_fmt(v['got'])}" + (f"  ({why})" if why else ""))
    return out


def misses_text(cases: Sequence[Case], preds: Mapping[str, Prediction], columns: Iterable[str] | None = None,
                only_healthy: bool = False) -> str:
    """Every case's misses (those columns only; healthy cases only), after a count per column."""
    cols = None if columns is None else set(columns)
    scope = [c for c in cases if c.healthy or not only_healthy]
    blocks = [b for b in (case_misses(c, preds[c.stem], cols) for c in scope) if b]
    wrong = [col for c in scope for col in judge(c, preds[c.stem]).wrong() if cols is None or col in cols]
    summary = ", ".join(f"{k} {wrong.count(k)}" for k in COLUMNS if k in wrong) or "none"
    return "\n".join([f"{len(blocks)} of {len(scope)} cases with a miss (wrong per column: {summary})", "",
                      *("\n".join(b) for b in blocks)])


# -- the table -------------------------------------------------------------------------------------------------

ROWS = (  # figure, row title, what it is counted over
    ("label_recall", "label recall (micro)", "expected (case, id) pairs"),
    ("label_precision", "label precision (micro)", "predicted (case, id) pairs"),
    ("final_exception", "final exception exact", "cases"),
    ("workers_found", "crashed workers named", "expected workers (+ extra names reported)"),
    ("root_cause", "root cause correct", "cases with a root cause"),
    ("last_step", "last step exact", "cases (null == null counts)"),
    ("total", "last bar's total exact", "cases (null == null counts)"),
    ("clean_negatives", "clean negatives", "healthy cases"),
)


def record(corpus: Path, cases: Sequence[Case], problems: Sequence[str], engine: Figures, grep: Figures,
           command: str) -> dict[str, Any]:
    """The one record the table, the .md file and --json are built from."""
    def figs(f: Figures) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, _, _ in ROWS:
            r = getattr(f, key)
            out[key] = {"ratio": r.value, "hit": r.hit, "of": r.of}
        out["workers_found"]["extra"] = f.workers_extra
        out["wall_s"] = round(f.wall_s, 4)
        return out

    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": command,
        "corpus": _rel(corpus), "cases": len(cases), "healthy": sum(c.healthy for c in cases),
        "skipped": list(problems), "targets": TARGETS, "engine": figs(engine), "grep": figs(grep),
        "wall_ratio_engine_over_grep": engine.wall_s / grep.wall_s if grep.wall_s else None,
    }


def _cell(fig: Mapping[str, Any], key: str) -> str:
    r = Ratio(fig[key]["hit"], fig[key]["of"])
    return str(r) + (f", +{fig[key]['extra']} extra" if "extra" in fig[key] else "")


def table(rec: Mapping[str, Any]) -> str:
    rows = [("figure", "engine", "grep -E (16 patterns)", "target", "over")]
    for key, title, over in ROWS:
        target = TARGETS.get(key)
        rows.append((title, _cell(rec["engine"], key), _cell(rec["grep"], key),
                     "" if target is None else f"≥ {target:.2f}", over))
    ratio = rec["wall_ratio_engine_over_grep"]
    rows.append(("wall time, whole corpus", f"{rec['engine']['wall_s']:.3f} s", f"{rec['grep']['wall_s']:.3f} s", "",
                 "engine/grep = " + ("n/a" if ratio is None else f"{ratio:.2f}x")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _rel(p: Path) -> str:
    p = p.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="folder of <stem>.log + <stem>.json cases "
                    f"(default {_rel(CORPUS)})")
    ap.add_argument("--misses", action="store_true", help="also list, per case, what the engine got wrong")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    ap.add_argument("--out", type=Path, default=OUT, help=f"where the table goes (default {_rel(OUT)})")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join([".venv/bin/python", "benchmarks/diagnose_corpus.py", *argv])
    cases, problems = load_corpus(args.corpus)
    engine = predict_all(cases, engine_predict)
    grep = predict_all(cases, grep_predict)
    rec = record(args.corpus, cases, problems, score(cases, engine), score(cases, grep), command)
    text = table(rec)
    skipped = [f"skipped {len(problems)} file(s) that cannot be scored:", *(f"  {p}" for p in problems)]
    md = "\n".join([
        "# diagnose on the real-log corpus, beside a 16-pattern grep -E", "",
        f"Command: `{command}`  ",
        f"Measured {rec['date']}: {rec['cases']} cases ({rec['healthy']} healthy) from `{rec['corpus']}`, "
        f"{os.cpu_count()} CPU cores. Column definitions and the grep patterns: the docstring of "
        "benchmarks/diagnose_corpus.py.", "", text, "", *(skipped if problems else []), ""])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    if args.json:
        if args.misses:
            diffs = {c.stem: case_diff(c, engine[c.stem]) for c in cases}
            rec["misses"] = {stem: diff for stem, diff in diffs.items() if diff}
        print(json.dumps(rec, indent=1))
        return 0
    print(f"{rec['cases']} cases ({rec['healthy']} healthy) from {rec['corpus']}\n")
    print(text)
    if problems:
        print("\n" + "\n".join(skipped))
    if args.misses:
        print("\nengine misses: " + misses_text(cases, engine))
    print(f"\nsaved {_rel(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
