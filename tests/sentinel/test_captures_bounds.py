"""A hang's capture folder stays bounded (agent/lib/captures.py): flight-recorder dumps are copied up to DUMPS_MAX
per capture (the rest listed with why), a rank's stacks are cut at STACKS_MAX, and a run keeps at most MAX_CAPTURES
folders (a run stalling again and again keeps its first ones, and says so). Real files in a real run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashctl.agent.lib import captures
from dflashctl.agent.probe.flightdumps import flight_dumps


def _doc(raw: str = "Thread 0x1 (most recent call first):\n") -> dict:
    return {"time": 1764770000.0, "reason": "stalled", "run_id": "r1",
            "processes": [{"pid": 11, "role": "child", "method": "faulthandler", "raw": raw, "error": None},
                          {"pid": 10, "role": "program", "method": None, "raw": None, "error": "no method"}]}


def test_dumps_past_the_limit_are_listed_not_copied_and_stacks_are_cut(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(captures, "DUMPS_MAX", 150)
    monkeypatch.setattr(captures, "STACKS_MAX", 8)
    monkeypatch.setattr(captures, "SETTLE_S", 0.01)
    (tmp_path / "flightrec").mkdir()
    for rank in range(3):
        (tmp_path / "flightrec" / f"nccl_trace_rank_{rank}").write_bytes(bytes(60))
    got = captures.save_capture(str(tmp_path), 2, _doc("x" * 20), {11: {"rank": 1, "local_rank": 1}})
    folder = Path(got["dir"])
    assert folder.parent == tmp_path / "captures" and folder.name == "2-20251203T135320Z"
    assert [d["name"] for d in got["dumps"]] == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    assert [(d["name"], d["bytes"]) for d in got["dumps_skipped"]] == [("nccl_trace_rank_2", 60)]
    assert sorted(p.name for p in (folder / "flightrec").iterdir()) == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    rank1 = json.loads((folder / "rank-1.pid-11.json").read_text())
    assert rank1["raw"] == "x" * 8 and rank1["truncated"] == 20 and rank1["rank"] == 1
    assert json.loads((folder / "pid-10.program.json").read_text())["error"] == "no method"
    index = json.loads((folder / "index.json").read_text())
    assert index["attempt"] == 2 and [s["file"] for s in index["stacks"]] == ["rank-1.pid-11.json",
                                                                             "pid-10.program.json"]


def test_a_run_keeps_at_most_max_captures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(captures, "MAX_CAPTURES", 2)
    made = [captures.save_capture(str(tmp_path), 1, _doc(), {}) for _ in range(3)]
    assert [Path(m["dir"]).name for m in made[:2]] == ["1-20251203T135320Z", "1-20251203T135320Z-2"]
    assert made[2]["dir"] is None and made[2]["error"] == "2 captures kept already in captures/"
    assert len(list((tmp_path / "captures").iterdir())) == 2


def test_a_capture_copies_the_files_the_probe_reads_as_dumps_and_no_link_or_folder(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch
                                                                                   ) -> None:
    monkeypatch.setattr(captures, "SETTLE_S", 0.01)
    (tmp_path / "flightrec").mkdir()
    (tmp_path / "flightrec" / "nccl_trace_rank_0").write_bytes(bytes(60))
    (tmp_path / "elsewhere").write_bytes(b"not the run's")
    (tmp_path / "flightrec" / "nccl_trace_rank_1").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "flightrec" / "nccl_trace_rank_2").mkdir()
    got = captures.save_capture(str(tmp_path), 1, _doc(), {})
    assert [d["name"] for d in got["dumps"]] == ["nccl_trace_rank_0"] and got["dumps_skipped"] == []
    probe_read = flight_dumps(str(tmp_path))  # 60 zero bytes are no dump: named as left out, so seen
    assert [s["name"] for s in probe_read["skipped"]] == ["nccl_trace_rank_0"] and probe_read["dumps"] == 0
