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

from dflashctl.analysis import flightrec

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
    traces = [flightrec.parse((dumps / f"fr_trace_rank_{r}{suffix}").read_bytes(),
                              flightrec.rank_of(f"fr_trace_rank_{r}{suffix}")) for r in (0, 1)]
    assert [t.rank for t in traces] == [0, 1]
    found = flightrec.behind(traces)
    assert len(found) == 1
    b = found[0]
    assert (b.behind, b.waiting, b.seq, b.op, b.pg_name) == ((1,), (0,), 5, "all_reduce", "default_pg")
    assert b.last[1] is not None and (b.last[1].op, b.last[1].seq) == ("broadcast", 4)
    assert b.line() == ("rank 1 behind: never entered all_reduce #5 of process group default_pg, where rank 0 wait "
                        "(rank 1's last: broadcast #4)")


def test_ranks_that_got_equally_far_show_no_one_behind(dumps: Path) -> None:
    one = flightrec.parse((dumps / "fr_trace_rank_1").read_bytes(), 1)
    again = flightrec.parse((dumps / "fr_trace_rank_1").read_bytes(), 2)
    assert flightrec.behind([one, again]) == []


class _Boom:
    def __reduce__(self):  # noqa: ANN204
        return (os.system, ("touch /tmp/dflashctl-flightrec-pwned",))


def test_a_pickle_that_is_not_a_dump_is_refused_and_never_run(tmp_path: Path) -> None:
    with pytest.raises(flightrec.DumpError, match="no flight recorder dump does"):
        flightrec.load(pickle.dumps({"entries": [_Boom()], "pg_status": {}}))
    assert not Path("/tmp/dflashctl-flightrec-pwned").exists()
    with pytest.raises(flightrec.DumpError, match="not a flight recorder dump"):
        flightrec.load(b'{"hello": 1}')
    with pytest.raises(flightrec.DumpError, match="neither a pickle nor JSON"):
        flightrec.load(b"step=1 loss=2.0\n")


def test_diagnose_reads_a_run_directorys_dumps_and_says_who_is_behind(dumps: Path, tmp_path: Path) -> None:
    from dflashctl.commands.diagnose import diagnose

    run = tmp_path / "run-1"
    (run / flightrec.DUMP_DIR).mkdir(parents=True)
    (run / "train.log").write_bytes(b"step=1 loss=2.0\nstep=2 loss=1.9\n")
    for r in (0, 1):
        (run / flightrec.DUMP_DIR / f"nccl_trace_rank_{r}").write_bytes((dumps / f"fr_trace_rank_{r}").read_bytes())
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
