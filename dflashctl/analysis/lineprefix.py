"""Per-line prefixes that launchers and loggers put before every line a process prints.

A traceback is recognised by its shape (`Traceback (most recent call last):`, indented `File "…"` frames, a final
`Type: message`), and prefixes hide that shape: torch ≥ 2.2 prints every line of a rank's traceback as
`[rank3]: …`, torchrun's `--tee` as `[default3]:…`, accelerate echoes its children as `stderr: …`, mpirun tags
`[1,3]<stderr>:`, job runners stamp each line with a time, a task and a uuid. `split` takes the prefix off and
says which rank's stream the line belongs to, so that the scanner reads the body as the program printed it and
keeps the ranks' interleaved tracebacks apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# stream prefixes: the line belongs to one rank's output (repeatable: `[rank0]:[rank0]: …`)
_STREAM_RE = re.compile(
    r"\[(?:rank|Rank|RANK):?\s?(?P<a>\d+)\]:?\s?"  # [rank3]: (torch.distributed), [rank: 3] (Lightning)
    r"|\[default(?P<b>\d+)\]:"  # torchrun --tee / --redirects: [default3]:… (nothing added after the colon)
    r"|rank(?P<c>\d+): "  # rank3: (torchtitan, custom loggers)
    r"|\[1,(?P<d>\d+)\]<std(?:out|err)>:"  # mpirun --tag-output
    r"|std(?:out|err): "  # accelerate / subprocess echo
    r"|(?P<e>\d{1,4}): (?=\S|\s+File )"  # srun --label: the task id (the global rank)
    r"|\(\w+ pid=\d+(?:, ip=[\d.]+)?\) "  # Ray: (RayTrainWorker pid=1234, ip=…)
)
# record prefixes: a time, a level, a logger or task tag in brackets — not a stream, but hides the body's shape
_TS = r"\[?\d{4}[-/]\d\d[-/]\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?"
_RECORD_RE = re.compile(
    rf"(?:{_TS}|\[(?!')[^\[\]\n]{{1,120}}\](?=\s)|[IWEF]\d{{4}} \d\d:\d\d:\d\d\.\d+\s+\d+\s+[\w/.-]+:\d+\]"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL):[\w.]*:(?=\S)"  # python logging's default LEVEL:name:
    # vLLM / SGLang: `ERROR 03-25 12:23:00 [x.py:4] …`
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?= \d\d-\d\d | \[)"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL) \d+(?= \[)"  # `%(levelname)s %(process)d [file.py:64]`
    r"|\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?|(?:stdout|stderr) [FP](?= )|> )(?: -)? ?"  # CRI: `<time> stderr F …`
)
_RANK_TAG_RE = re.compile(r"\[(?:PG \d+(?: [^\]]*?)? )?Rank (\d+)\]")  # `[Rank 3] Watchdog …`, `[PG 1 Rank 0]`
_ANSI_REMNANT_RE = re.compile(r"\[(?:\d{1,3};)*\d{1,3}m")  # `[36m…[0m`: colour codes whose ESC a paste lost
_DIGITS_RE = re.compile(r"\d+")


@dataclass(frozen=True)
class Split:
    body: str  # the line as the program printed it
    rank: int | None  # the rank whose stream it is (a stream prefix), else None
    record: str  # the record prefix taken off, digits masked ('' when none): lines of one record share it


def split(text: str) -> Split:
    """The line's body, its rank, and the shape of its record prefix."""
    if "[0m" in text or "[1m" in text:
        text = _ANSI_REMNANT_RE.sub("", text)
    rank: int | None = None
    record = ""
    pos = 0
    for _ in range(8):  # prefixes nest: `2024-… [task] [uuid] [rank0]: …`
        m = _STREAM_RE.match(text, pos)
        if m:
            got = m.group("a") or m.group("b") or m.group("c") or m.group("d") or m.group("e")
            if got is not None and rank is None:
                rank = int(got)
            pos = m.end()
            continue
        m = _RECORD_RE.match(text, pos)
        if m and m.end() > pos and m.end() < len(text):
            tag = _RANK_TAG_RE.fullmatch(m.group(0).strip(" -"))
            if tag and rank is None:
                rank = int(tag.group(1))
            record += _DIGITS_RE.sub("0", m.group(0))
            pos = m.end()
            continue
        break
    return Split(text[pos:] if pos else text, rank, record)


def rank_tag(text: str) -> int | None:
    """The rank a message names about itself: `[Rank 3] Watchdog caught …`, `[PG 1 Rank 0] Exception …`."""
    m = _RANK_TAG_RE.search(text)
    return int(m.group(1)) if m else None
