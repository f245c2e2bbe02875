"""The run's flight recorder dumps, judged where they lie (stdlib only): `status` says which rank is behind and in
which collective without copying megabytes of dumps over ssh.

Two places hold dumps: where the program's recorder writes them (`<TORCH_FR_DUMP_TEMP_FILE><rank>`, by default
`<run>/flightrec/nccl_trace_rank_<rank>`: agent/lib/captures.py `dump_prefix`, the one rule), and the copies the
sentinel saved with every rank's stacks when the run stalled (`<run>/captures/<attempt>-<stamp>/flightrec/`). The
newest set is read (the one whose newest file is the newest). Only the verdict travels: the dumps read, those left
out and why, and per process group who is behind (agent/lib/flightrec.py, the parser `diagnose` runs too).
Bounded: at most FR_FILES_MAX files of at most FR_FILE_MAX bytes each; a --watch parses a file again only when its
size or mtime changed.
"""

from __future__ import annotations

import os

from dflashctl.agent.lib.captures import CAPTURES_DIR, dump_files, dump_prefix
from dflashctl.agent.lib.flightrec import DumpError, dump_rank, find_behind, parse_dump
from dflashctl.agent.lib.flightrec_env import DUMP_DIR

FR_FILES_MAX = 256  # dumps read per report (one per rank of this node; more are named as left out)
FR_FILE_MAX = 64 << 20  # a rank's dump above this is left out (2000 entries with stack frames are a few MB)
FR_SKIPPED_MAX = 8  # left-out files named in the reply
_FR_SEEN: dict = {}  # path -> (size, mtime_ns, RankTrace | why it was left out): a --watch's parsed dumps


def _dump_sets(run_dir: str) -> dict:
    """folder -> its dump files: where the recorder writes, and each capture's copies."""
    prefix = dump_prefix(run_dir)
    sets = {os.path.dirname(prefix) or ".": dump_files(os.path.dirname(prefix) or ".", os.path.basename(prefix))}
    captures = os.path.join(run_dir, CAPTURES_DIR)
    try:
        names = sorted(os.listdir(captures))
    except OSError:
        names = []
    for name in names:
        folder = os.path.join(captures, name, DUMP_DIR)
        sets[folder] = dump_files(folder)
    return {k: v for k, v in sets.items() if v}


def _trace(path: str, st: os.stat_result, rank: int):  # noqa: ANN202 - RankTrace | str
    if st.st_size > FR_FILE_MAX:
        return f"{st.st_size / 2**20:.1f} MiB, above the {FR_FILE_MAX / 2**20:.1f} MiB read per dump"
    seen = _FR_SEEN.get(path)
    if seen is not None and seen[:2] == (st.st_size, st.st_mtime_ns):
        return seen[2]
    try:
        with open(path, "rb") as f:
            got = parse_dump(f.read(FR_FILE_MAX + 1), rank)
    except OSError as e:
        got = f"unreadable: {e.strerror}"
    except DumpError as e:
        got = str(e)
    _FR_SEEN[path] = (st.st_size, st.st_mtime_ns, got)
    return got


def flight_dumps(run_dir: str) -> dict | None:
    """The newest set of the run's dumps, judged; None when there are none."""
    sets = _dump_sets(run_dir)
    if not sets:
        return None
    folder, files = max(sets.items(), key=lambda kv: max(st.st_mtime for _, _, st in kv[1]))
    traces, skipped = [], []
    files.sort(key=lambda f: (dump_rank(f[0]) is None, dump_rank(f[0]) or 0, f[0]))
    for i, (name, path, st) in enumerate(files):
        rank = dump_rank(name)
        got = "more dumps than are read per report" if i >= FR_FILES_MAX else \
            "no rank at the end of its name" if rank is None else _trace(path, st, rank)
        if isinstance(got, str):
            skipped.append({"name": name, "why": got})
        else:
            traces.append(got)
    for gone in set(_FR_SEEN) - {path for _, path, _ in files}:  # a watch keeps only the set it shows
        del _FR_SEEN[gone]
    return {"dir": folder, "dumps": len(traces), "ranks": [t.rank for t in traces],
            "newest": max(st.st_mtime for _, _, st in files), "skipped_count": len(skipped),
            "skipped": skipped[:FR_SKIPPED_MAX], "behind": [b.to_record() for b in find_behind(traces)][:16]}
