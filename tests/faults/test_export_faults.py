"""export against a hostile container and under signals: no local path is built from what the container says
unchecked, a malformed reply is one line naming the host (exit 100), and the temporary `.NAME.part-PID` folder
is gone after every catchable signal and after the next export when a SIGKILL left it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.poll import wait_until

from faults.hostenv import HERE, RUN_ID, hostile_host

SHA_OF_BRACES = "ca3d163bab055381827226140568f3bef7eaac187cebd76878e0b63e9e442356"  # sha256 of b"{}\n"


@pytest.fixture
def host(local_host, tmp_path, monkeypatch):
    run_dir = hostile_host(local_host, tmp_path)
    work = tmp_path / "laptop" / "cwd"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    yield run_dir
    (tmp_path / "go").touch()  # a stalled tar stand-in (tests/faults/slowtar) whose reader was killed ends now


def _honest_reply(run_dir: Path) -> str:
    files = {n: {"size": 3, "sha256": SHA_OF_BRACES} for n in ("config.json", "model.safetensors")}
    return json.dumps({"out": f"{run_dir}/exports/step-00000001-bfloat16", "files": files, "reused": False})


def test_a_run_id_that_climbs_out_of_the_folder_is_refused_and_nothing_is_written(host, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOSTILE_RUN_ID", "../../escaped")
    monkeypatch.setenv("HOSTILE_EXPORT", _honest_reply(host))
    def files() -> list[Path]:  # the agent archive's install (<workspace>/.agent) is the call's, not the reply's
        return sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if ".agent" not in p.parts)

    before = files()
    res = cli("export", RUN_ID)
    assert res.code == 100, (res.code, res.err)
    assert res.err.splitlines()[0] == ("ERROR: host local sent a malformed run id: '../../escaped' "
                                       "(expected letters, digits, '.', '_', '-')")
    assert "Traceback" not in res.err
    assert files() == before  # not a folder made anywhere


@pytest.mark.parametrize("bad_id", ["/tmp/abs", "..", ".hidden", "a\nb", "run\x1b[2J", "x" * 300, ""])
def test_every_run_id_that_is_not_a_plain_name_is_refused(host, cli, monkeypatch, bad_id):
    monkeypatch.setenv("HOSTILE_RUN_ID", bad_id)
    monkeypatch.setenv("HOSTILE_EXPORT", _honest_reply(host))
    res = cli("export", RUN_ID)
    assert res.code == 100 and "sent a malformed run id" in res.err and "Traceback" not in res.err, res.err
    assert not Path("drafters").exists()


@pytest.mark.parametrize(("reply", "why"), [
    ('{"files": {}}', "`out` is not an absolute path"),
    ('{"out": "/x/step-1"}', "`files` does not list"),
    ('{"out": "/x/step-1", "files": {"config.json": "x", "model.safetensors": "y"}}', "lacks its size or sha256"),
    ('{"out": "/x/step-1", "files": {"config.json": {"size": 3}, "model.safetensors": {"size": 3}}}',
     "lacks its size or sha256"),
    ('{"out": "/x/step-1", "files": ["config.json"]}', "`files` does not list"),
    ('["out"]', "not an object"),
    ("not json at all", "not JSON"),
    ('{"out": "/x/..", "files": {"config.json": {"size": 3, "sha256": "a"}, '
     '"model.safetensors": {"size": 3, "sha256": "a"}}}', "malformed export folder name"),
])
def test_an_export_reply_missing_a_field_is_one_line_naming_the_host(host, cli, monkeypatch, reply, why):
    monkeypatch.setenv("HOSTILE_EXPORT", reply)
    res = cli("export", RUN_ID)
    assert res.code == 100, (res.code, res.err)
    assert why in res.err and "host local" in res.err and "Traceback" not in res.err, res.err
    assert not Path("drafters").exists()


def test_an_honest_reply_still_exports(host, cli, monkeypatch):
    monkeypatch.setenv("HOSTILE_EXPORT", _honest_reply(host))
    res = cli("export", RUN_ID, "--json")
    assert res.code == 0, res.err
    assert res.json()["local_dir"] == f"drafters/{RUN_ID}-step-00000001-bfloat16"
    assert sorted(p.name for p in Path(res.json()["local_dir"]).iterdir()) == ["config.json", "model.safetensors"]


# ------------------------------------------------------------------------------------------ signals and leftovers


def _slow_export(local_host, tmp_path: Path, run_dir: Path, out: Path) -> tuple[subprocess.Popen[str], Path]:
    """`dflashctl export` as its own process, its tar stream stalled after 64 KiB (tests/faults/slowtar/tar)."""
    mark = tmp_path / "tar-started"
    env = {**os.environ, "PATH": f"{HERE / 'slowtar'}:{os.environ['PATH']}", "SLOW_TAR_MARK": str(mark),
           "SLOW_TAR_GO": str(tmp_path / "go"),
           "HOSTILE_EXPORT": f"auto:{run_dir}/exports/step-00000001-bfloat16:{4 << 20}"}
    proc = subprocess.Popen([sys.executable, "-m", "dflashctl", "export", RUN_ID, "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: mark.exists() or proc.poll() is not None, 60, "the copy to start")
    assert proc.poll() is None, proc.communicate()
    wait_until(lambda: list(out.parent.glob(f".{out.name}.part-{proc.pid}")), 30, "the temporary folder")
    return proc, mark


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_export_interrupted_by_a_catchable_signal_leaves_no_temporary_folder(host, local_host, tmp_path, sig):
    out = tmp_path / "laptop" / "drafter"
    proc, _ = _slow_export(local_host, tmp_path, host, out)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err == "ERROR: interrupted\n", err  # one line, never a traceback or silence
    assert sorted(p.name for p in out.parent.iterdir()) == ["cwd"]  # no .drafter.part-PID, no drafter


def test_the_next_export_removes_what_a_sigkilled_one_left(host, local_host, tmp_path, cli, monkeypatch):
    out = tmp_path / "laptop" / "drafter"
    proc, _ = _slow_export(local_host, tmp_path, host, out)
    proc.kill()
    proc.communicate(timeout=60)
    left = out.parent / f".drafter.part-{proc.pid}"
    assert left.is_dir()  # SIGKILL cannot be caught: it stays until the next export
    live = out.parent / f".other.part-{os.getpid()}"  # a transfer of a live process (ours) is never touched
    live.mkdir()
    monkeypatch.setenv("HOSTILE_EXPORT", _honest_reply(host))
    res = cli("export", RUN_ID, "--out", str(out.parent / "second"))
    assert res.code == 0, res.err
    assert not left.exists() and live.is_dir()


def test_an_out_folder_that_appears_during_the_copy_is_kept_and_the_copy_says_so(host, local_host, tmp_path):
    out = tmp_path / "laptop" / "drafter"
    proc, _ = _slow_export(local_host, tmp_path, host, out)
    out.mkdir()
    (out / "mine.txt").write_text("the user's\n")
    (tmp_path / "go").touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (proc.returncode, err)
    assert err.splitlines()[0] == f"ERROR: {out}: appeared while the copy ran (an export never overwrites)", err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["cwd", "drafter"]
