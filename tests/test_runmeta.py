"""meta.json is read in one place (agent/lib/runmeta.py) into one typed record, and reads whatever wrote it.

Runs written by an older or newer dflashctl, and meta.json files edited by hand, must still list and judge: unknown
keys survive a round trip, missing or mistyped ones take their defaults. The record is the same on both sides: the
container reads the file (read_meta), the laptop the probe's copy of it (report.parse_run).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from dflashctl.agent.lib.runmeta import RunMeta, read_meta, write_meta
from dflashctl.agent.lib.runstate import live_latest, node_lead_dir, run_state
from dflashctl.report import RunRecord, parse_run

REPO = Path(__file__).resolve().parent.parent

# what agent/launcher.py writes for a restarted attempt of a run across two hosts (fields as launched today)
WRITTEN = {
    "name": "sweep", "host": "pve1", "container": 200, "config": {"source": "configs/tiny.toml", "uploaded": True},
    "code_hash": "ab12", "git_sha": None, "gpus": {"target": [0], "drafters": [1, 2]}, "launched_by": "dflashctl",
    "kind": "train", "sentinel": {"sha256": "ff"}, "env": ["WANDB_MODE"], "id": "20261203-101500-sweep",
    "run_dir": "/ws/runs/20261203-101500-sweep", "argv": ["python3", "-m", "trainer", "--run-dir", "/d", "--lr", "3"],
    "cwd": "/ws/.code/ab12", "started_at": "2026-12-03T10:15:00Z", "started_at_epoch": 1796292900.5,
    "attempt": 2, "restart_of": "20261203-100000-sweep", "restart_why": "crashed (exit 1)",
    "chain": {"first": "20261203-100000-sweep", "previous": "20261203-100000-sweep", "attempt": 2, "attempts_max": 4},
    "cluster": {"name": "pair", "node_rank": 1, "nnodes": 2, "nproc_per_node": 4,
                "rendezvous": "n0.example.invalid:29500",
                "members": [{"host": "pve1", "node_rank": 0}, {"host": "pve2", "node_rank": 1}]},
}


def test_a_launched_runs_meta_reads_typed() -> None:
    m = RunMeta.from_record(WRITTEN)
    assert (m.id, m.name, m.kind, m.host, m.container) == ("20261203-101500-sweep", "sweep", "train", "pve1", 200)
    assert m.argv == ("python3", "-m", "trainer", "--run-dir", "/d", "--lr", "3")
    assert m.started_at_epoch == 1796292900.5 and m.started_at == "2026-12-03T10:15:00Z"
    assert m.attempt == 2 and m.attempt_label == "2/4 after 20261203-100000-sweep"
    assert m.restart_of == "20261203-100000-sweep"
    assert m.members == [("pve1", 0), ("pve2", 1)]
    assert m.lead_rank == 4  # node 1 of 4 processes a node: its lowest global rank
    assert not m.is_job and m.job_line is None and m.adopted_identity is None


def test_unknown_keys_survive_a_round_trip_through_the_record() -> None:
    newer = dict(WRITTEN, serving={"engine": "sglang", "port": 30000}, kind="serve")
    m = RunMeta.from_record(json.loads(json.dumps(newer)))
    assert m.extra["serving"] == {"engine": "sglang", "port": 30000}
    assert m.extra["restart_why"] == "crashed (exit 1)" and m.extra["launched_by"] == "dflashctl"
    assert m.kind == "serve"  # a kind this version does not know is kept, not rewritten
    assert m.to_record() == {k: v for k, v in newer.items() if v is not None}


def test_missing_and_mistyped_keys_take_their_defaults() -> None:
    bad = {"name": 7, "kind": None, "argv": "python train.py", "started_at_epoch": "yesterday", "container": True,
           "chain": [1, 2], "cluster": {"members": [{"host": "pve1"}]}, "attempt": "2"}
    m = RunMeta.from_record(bad)
    assert (m.name, m.kind, m.argv, m.started_at_epoch, m.container, m.chain) == (None, "train", (), None, None, None)
    assert m.attempt is None and m.attempt_label == "-"
    assert m.members is None and m.lead_rank == 0  # a `cluster` edited out of shape reads as a one-host run
    for doc in (None, [], "x", 3):
        assert RunMeta.from_record(doc) == RunMeta()


def test_jobs_and_adopted_runs_say_what_they_are() -> None:
    ev = RunMeta.from_record({"kind": "eval", "job": "evaluating run r1"})
    assert ev.is_job and ev.job_line == "evaluating run r1"
    assert RunMeta.from_record({"kind": "generate"}).job_line == "a generate run"
    ad = RunMeta.from_record({"kind": "adopted", "adopted": {"pid": 42, "starttime": 9}})
    assert ad.adopted_identity == {"pid": 42, "starttime": 9} and not ad.is_job
    assert RunMeta.from_record({"kind": "adopted"}).adopted_identity == {}  # adopted, identity not recorded
    assert RunMeta.from_record({"adopted": {"pid": 42}}).adopted_identity is None  # only kind adopted counts


def test_read_meta_reads_the_file_and_tolerates_a_missing_or_torn_one(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(WRITTEN))
    assert read_meta(str(tmp_path)) == RunMeta.from_record(WRITTEN)
    (tmp_path / "meta.json").write_text('{"name": "swe')
    assert read_meta(str(tmp_path)) == RunMeta()
    assert read_meta(str(tmp_path / "gone")) == RunMeta()


def test_the_container_and_the_laptop_read_the_same_record(tmp_path: Path) -> None:
    """run_state sends meta.json as written; the laptop's RunRecord holds the RunMeta the container read."""
    runs = tmp_path / "runs"
    run_dir = runs / "20261203-101500-sweep"
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps(WRITTEN))
    (run_dir / "exit_code").write_text("0\n")
    state = run_state(run_dir.name, str(run_dir))
    assert state["meta"] == WRITTEN
    rec = parse_run(json.loads(json.dumps(state)))
    assert rec.meta == read_meta(str(run_dir))
    assert node_lead_dir(str(run_dir), rec.meta) == f"{run_dir}/rank-4"
    (runs / "latest").symlink_to(run_dir.name)
    assert live_latest(str(runs)) is None  # exit_code recorded: ended


def test_a_run_record_built_from_a_plain_dict_holds_a_run_meta() -> None:
    rec = RunRecord(id="r", dir="/ws/runs/r", pid=None, alive=False, exit_code=None, stopped=False,
                    meta={"kind": "eval"})  # type: ignore[arg-type]
    assert isinstance(rec.meta, RunMeta) and rec.meta.is_job
    assert RunRecord(id="r", dir="/d", pid=None, alive=False, exit_code=None, stopped=False).meta == RunMeta()


def test_the_one_json_shape_of_a_run_has_every_key_whatever_is_known() -> None:
    bare = RunRecord(id="r", dir="/ws/runs/r", pid=None, alive=False, exit_code=None, stopped=False)
    full = parse_run({"id": "x", "dir": "/ws/runs/x", "pid": 7, "alive": True, "exit_code": None, "meta": WRITTEN})
    a, b = bare.to_record(), full.to_record(verdict="training", now=1796292960.5, last_step=12)
    assert list(a) == list(b)
    got = (b["name"], b["verdict"], b["duration_s"], b["last_step"], b["attempt"])
    assert got == ("sweep", "training", 60.0, 12, 2)
    assert a["verdict"] is None and a["log_path"] == "/ws/runs/r/train.log"


def test_meta_json_is_read_only_by_runmeta() -> None:
    """Nothing else in dflashctl reads meta.json or picks keys out of a run's raw meta: the launcher writes it (one
    atomic write), runmeta.py reads it, run_state forwards the file's JSON to the laptop unread."""
    readers = []
    for path in sorted((REPO / "dflashctl").rglob("*.py")):
        if path.name == "runmeta.py":
            continue
        tree = ast.parse(path.read_text())
        written = {id(c) for call in ast.walk(tree) if isinstance(call, ast.Call)
                   and getattr(call.func, "id", getattr(call.func, "attr", None)) == "write_atomic"
                   for c in ast.walk(call)}
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "meta":
                readers.append(f"{where} .meta[...]")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "meta":
                readers.append(f"{where} .meta.get(...)")
            if isinstance(node, ast.Constant) and node.value == "meta.json" and id(node) not in written:
                readers.append(f"{where} 'meta.json'")
    assert readers == []


def test_the_one_writer_keeps_every_key_the_launcher_gives_and_reads_back_the_same_record(tmp_path: Path) -> None:
    written = write_meta(str(tmp_path), WRITTEN)
    on_disk = json.loads((tmp_path / "meta.json").read_text())
    assert on_disk == {k: v for k, v in WRITTEN.items() if v is not None}  # only the None ones are left out
    assert read_meta(str(tmp_path)) == written == RunMeta.from_record(WRITTEN)
