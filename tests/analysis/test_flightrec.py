"""The flight recorder reader on real dumps: a real 2-rank gloo job (torch on CPU) that hangs because rank 1 leaves out
a collective; each rank's dump is torch's own (`_dump_fr_trace`, pickle and JSON). The reader must say rank 1 is behind,
that rank 0 waits in all_reduce #5, and what rank 1 did last; a file that is not a dump is refused, never executed."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.agent.lib import flightrec
from dflashctl.agent.lib.flightrec_env import DUMP_DIR

HANG = Path(__file__).parent / "data" / "flightrec" / "hang2.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fr")
    port = str(_port())
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100"}
    procs = [subprocess.Popen([sys.executable, str(HANG), str(r), port, str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, output.decode(errors="replace")[-2000:]
    return out


@pytest.mark.parametrize("suffix", ["", ".json"])
def test_the_rank_that_left_out_a_collective_is_behind_and_the_other_waits_in_it(dumps: Path, suffix: str) -> None:
    traces = [flightrec.parse_dump((dumps / f"fr_trace_rank_{r}{suffix}").read_bytes(),
                              flightrec.dump_rank(f"fr_trace_rank_{r}{suffix}")) for r in (0, 1)]
    assert [t.rank for t in traces] == [0, 1]
    found = flightrec.find_behind(traces)
    assert len(found) == 1
    b = found[0]
    assert (b.behind, b.waiting, b.seq, b.op, b.pg_name) == ((1,), (0,), 5, "all_reduce", "default_pg")
    assert b.last[1] is not None and (b.last[1].op, b.last[1].seq) == ("broadcast", 4)
    assert b.line() == ("rank 1 behind: never entered all_reduce #5 of process group default_pg, where rank 0 waits "
                        "(rank 1's last: broadcast #4)")


def test_ranks_that_got_equally_far_show_no_one_behind(dumps: Path) -> None:
    one = flightrec.parse_dump((dumps / "fr_trace_rank_1").read_bytes(), 1)
    again = flightrec.parse_dump((dumps / "fr_trace_rank_1").read_bytes(), 2)
    assert flightrec.find_behind([one, again]) == []


class _Boom:
    def __reduce__(self):  # noqa: ANN204
        return (os.system, ("touch /tmp/dflashctl-flightrec-pwned",))


def test_a_pickle_that_is_not_a_dump_is_refused_and_never_run(tmp_path: Path) -> None:
    with pytest.raises(flightrec.DumpError, match="no flight recorder dump does"):
        flightrec.load_dump(pickle.dumps({"entries": [_Boom()], "pg_status": {}}))
    assert not Path("/tmp/dflashctl-flightrec-pwned").exists()
    with pytest.raises(flightrec.DumpError, match="not a flight recorder dump"):
        flightrec.load_dump(b'{"hello": 1}')
    with pytest.raises(flightrec.DumpError, match="neither a pickle nor JSON"):
        flightrec.load_dump(b"step=1 loss=2.0\n")


def test_diagnose_reads_a_run_directorys_dumps_and_says_who_is_behind(dumps: Path, tmp_path: Path) -> None:
    from dflashctl.commands.diagnose import diagnose

    run = tmp_path / "run-1"
    (run / DUMP_DIR).mkdir(parents=True)
    (run / "train.log").write_bytes(b"step=1 loss=2.0\nstep=2 loss=1.9\n")
    for r in (0, 1):
        (run / DUMP_DIR / f"nccl_trace_rank_{r}").write_bytes((dumps / f"fr_trace_rank_{r}").read_bytes())
    d = diagnose([run], [])
    assert [b.behind for b in d.behind] == [(1,)]
    rec = d.to_record()["flight_recorder"]
    assert rec == [{"process_group": "default_pg", "collective": "all_reduce", "seq": 5, "behind": [1], "waiting": [0],
                    "summary": d.behind[0].line()}]
    assert "flight_recorder" not in diagnose([run / "train.log"], []).to_record()  # no dumps read: no key


def test_dumps_given_as_files_are_read_as_dumps_and_a_bad_one_is_one_line(dumps: Path, tmp_path: Path) -> None:
    from dflashctl.commands.diagnose import diagnose
    from dflashctl.errors import ConfigError

    files = [dumps / f"fr_trace_rank_{r}.json" for r in (0, 1)]
    assert [b.waiting for b in diagnose(files, []).behind] == [(0,)]
    bad = tmp_path / "nccl_trace_rank_2"
    bad.write_bytes(b"not a dump\n")
    with pytest.raises(ConfigError) as e:
        diagnose([bad], [])
    assert "neither a pickle nor JSON" in str(e.value) and "\n" not in str(e.value)


# ---- status: the probe judges the run's dumps in the container (agent/probe/flightdumps.py), only the verdict travels

RUN = "20261203-130000-frhang"


def _workspace_run(tmp_path: Path) -> Path:
    import json

    run = tmp_path / "ws" / "runs" / RUN
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"id": RUN, "name": "frhang", "started_at_epoch": 1.0}))
    (run / "train.log").write_text("step=1 loss=2.0\n")
    return run


def _probe_doc(tmp_path: Path) -> dict:
    import json

    from dflashctl.agent.probe.main import report
    from dflashctl.agent.probe.request import ProbeRequest

    return json.loads(json.dumps(report(ProbeRequest(workspace=str(tmp_path / "ws"), run=RUN, events=True), None,
                                        None)))


def _put(run: Path, dumps: Path, folder: str = "", ranks: tuple[int, ...] = (0, 1), mtime: float | None = None) -> None:
    where = run / DUMP_DIR / folder
    where.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        (where / f"nccl_trace_rank_{r}").write_bytes((dumps / f"fr_trace_rank_{r}").read_bytes())
        if mtime is not None:
            os.utime(where / f"nccl_trace_rank_{r}", (mtime, mtime))


def test_status_says_which_rank_is_behind_from_dumps_judged_in_the_container(dumps: Path, tmp_path: Path) -> None:
    from rich.console import Console

    from dflashctl.analysis.watcher import Watcher
    from dflashctl.cli.statusview import render_view
    from dflashctl.report import parse_report

    run = _workspace_run(tmp_path)
    assert _probe_doc(tmp_path)["flight_recorder"] is None  # no dumps: nothing said
    _put(run, dumps)
    doc = _probe_doc(tmp_path)
    size = sum(len((dumps / f"fr_trace_rank_{r}").read_bytes()) for r in (0, 1))
    assert len(__import__("json").dumps(doc["flight_recorder"])) < min(2048, size)  # the verdict, not the dumps
    view = Watcher("h").update(parse_report(doc))
    fr = view.to_record()["flight_recorder"]
    assert (fr["dumps"], fr["ranks"], fr["skipped_count"]) == (2, [0, 1], 0)
    assert fr["behind"] == [{"process_group": "default_pg", "collective": "all_reduce", "seq": 5, "behind": [1],
                             "waiting": [0], "summary": "rank 1 behind: never entered all_reduce #5 of process group "
                             "default_pg, where rank 0 waits (rank 1's last: broadcast #4)"}]
    console = Console(width=200, record=True)
    console.print(render_view(view))
    lines = console.export_text().splitlines()
    assert lines[1].startswith("flight recorder: rank 1 behind: never entered all_reduce #5")  # right under the header
    assert "flight recorder dumps of ranks 0,1" in lines[2]


def test_the_newest_set_of_dumps_is_read_and_files_that_are_not_dumps_are_named(dumps: Path, tmp_path: Path) -> None:
    """An older live dump of rank 0 alone, and the set the sentinel saved with the stacks at a later stall
    (agent/lib/captures.py: `<run>/captures/<attempt>-<stamp>/flightrec/`): the saved set is the newest."""
    run = _workspace_run(tmp_path)
    _put(run, dumps, ranks=(0,), mtime=1_000_000.0)
    (run / DUMP_DIR / "README").write_bytes(b"x")  # not named as the recorder names its dumps: not read
    saved = Path("..") / "captures" / "1-20261203T140000Z" / DUMP_DIR
    _put(run, dumps, str(saved), mtime=2_000_000.0)
    (run / DUMP_DIR / saved / "nccl_trace_rank_2").write_bytes(b"torn\n")
    (run / DUMP_DIR / saved / "nccl_trace_rank_x").write_bytes(b"x")
    fr = _probe_doc(tmp_path)["flight_recorder"]
    assert fr["dir"] == str(run / "captures" / "1-20261203T140000Z" / "flightrec") and fr["ranks"] == [0, 1]
    assert [b["behind"] for b in fr["behind"]] == [[1]]
    assert fr["skipped"] == [{"name": "nccl_trace_rank_2", "why": "neither a pickle nor JSON"},
                             {"name": "nccl_trace_rank_x", "why": "no rank at the end of its name"}]


def test_dumps_where_the_users_own_recorder_variable_sends_them_are_read(dumps: Path, tmp_path: Path) -> None:
    import json

    run = _workspace_run(tmp_path)
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (run / "launch.json").write_text(json.dumps({"env": {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{elsewhere}/fr_"}}))
    for r in (0, 1):
        (elsewhere / f"fr_{r}").write_bytes((dumps / f"fr_trace_rank_{r}").read_bytes())
    (elsewhere / "other_0").write_bytes(b"not ours")
    fr = _probe_doc(tmp_path)["flight_recorder"]
    assert (fr["dir"], fr["ranks"], fr["skipped_count"]) == (str(elsewhere), [0, 1], 0)
    assert [b["behind"] for b in fr["behind"]] == [[1]]


def test_dumps_beyond_the_bounds_are_left_out_saying_so(dumps: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from dflashctl.agent.probe import flightdumps

    run = _workspace_run(tmp_path)
    _put(run, dumps)
    small = min(len((dumps / f"fr_trace_rank_{r}").read_bytes()) for r in (0, 1)) - 1
    monkeypatch.setattr(flightdumps, "FR_FILE_MAX", small)
    fr = _probe_doc(tmp_path)["flight_recorder"]
    assert fr["dumps"] == 0 and fr["skipped_count"] == 2 and fr["behind"] == []
    assert all("above the" in s["why"] for s in fr["skipped"])
    monkeypatch.setattr(flightdumps, "FR_FILE_MAX", 64 << 20)
    monkeypatch.setattr(flightdumps, "FR_FILES_MAX", 1)
    fr = _probe_doc(tmp_path)["flight_recorder"]
    assert fr["ranks"] == [0] and fr["skipped"] == [{"name": "nccl_trace_rank_1",
                                                     "why": "more dumps than are read per report"}]


def test_a_watch_reads_a_dump_again_once_it_changed(dumps: Path, tmp_path: Path) -> None:
    run = _workspace_run(tmp_path)
    _put(run, dumps, mtime=1_000_000.0)
    assert [b["behind"] for b in _probe_doc(tmp_path)["flight_recorder"]["behind"]] == [[1]]
    one = run / DUMP_DIR / "nccl_trace_rank_1"
    one.write_bytes((dumps / "fr_trace_rank_0").read_bytes())  # rank 1 caught up: both as far as rank 0
    os.utime(one, (1_000_001.0, 1_000_001.0))
    fr = _probe_doc(tmp_path)["flight_recorder"]
    assert fr["behind"] == [] and fr["dumps"] == 2


def test_a_dump_with_values_of_the_wrong_kind_is_one_dump_error() -> None:
    bad = pickle.dumps({"pg_status": {"0": {}}, "entries": 5})
    with pytest.raises(flightrec.DumpError, match="wrong kind"):
        flightrec.parse_dump(bad, 0)
    with pytest.raises(flightrec.DumpError, match="wrong kind"):
        flightrec.parse_dump(b'{"pg_status": [1], "entries": []}', 0)


def test_the_line_says_which_ranks_wait_in_the_right_number() -> None:
    b = flightrec.Behind("0", "default_pg", 5, "all_reduce", (0, 2, 3), (1,), {1: None})
    assert b.line() == ("rank 1 behind: never entered all_reduce #5 of process group default_pg, where ranks 0, 2, 3 "
                        "wait (rank 1 recorded none)")
    assert flightrec.behind_from_record(b.to_record()) == b


def test_the_recorders_verdict_follows_the_cause_when_the_log_names_one(dumps: Path, tmp_path: Path) -> None:
    """Issue 28 part 4: the cause first (the signature, its remedy), then who is behind where, then the rest."""
    from rich.console import Console

    from dflashctl.analysis.watcher import Watcher
    from dflashctl.cli.statusview import render_view
    from dflashctl.report import parse_report

    run = _workspace_run(tmp_path)
    (run / "train.log").write_text(
        "step=4 loss=2.0\n[rank0]:[E1203 14:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) "
        "ran for 600011 milliseconds before timing out.\n")
    (run / "exit_code").write_text("1\n")
    _put(run, dumps)
    view = Watcher("h").update(parse_report(_probe_doc(tmp_path)))
    console = Console(width=300, record=True)
    console.print(render_view(view))
    lines = console.export_text().splitlines()
    cause = next(i for i, ln in enumerate(lines) if ln.startswith("cause: nccl-timeout"))
    flight = next(i for i, ln in enumerate(lines) if ln.startswith("flight recorder: rank 1 behind"))
    why = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("why:"))
    assert cause == 1 and cause < flight < why, lines


def test_the_sentinels_capture_says_who_is_behind_from_the_dumps_it_saved(dumps: Path, tmp_path: Path) -> None:
    from dflashctl.sentinel.main import recorder_verdict

    run = _workspace_run(tmp_path)
    assert recorder_verdict(str(run)) == []  # no dumps: nothing to say, and no error
    _put(run, dumps, "../captures/1-20261203-130500/flightrec")
    assert recorder_verdict(str(run)) == [
        "rank 1 behind: never entered all_reduce #5 of process group default_pg, where rank 0 waits "
        "(rank 1's last: broadcast #4)"]
