"""A watch ends when its run is gone — each way a distinct verdict and exit code (docs/usage.md, "When a watch
ends"): the run directory deleted (`run-gone`, 102) or replaced by another run of the same id (`run-replaced`,
102), the container stopped or destroyed (`container-gone`, 102), the host replaced: its host key changed
(`host-replaced`, 2). Before, a deleted run was watched as `"run": null, "verdict": "training"` forever."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.poll import wait_until


@pytest.fixture
def sleeper(local_host, cli, tmp_path):
    """Launch a run that sleeps; its process group is ended at teardown, by its pid (its directory may be gone)."""
    groups: list[int] = []

    def launch() -> str:
        src = tmp_path / "src"
        src.mkdir(exist_ok=True)
        (src / "job.sh").write_text("sleep 600\n")
        res = cli("launch", "--exec", "--source", str(src), "--no-sentinel", "--name", "sleeper", "--json", "--",
                  "sleep", "600")
        assert res.code == 0, res.err
        run_id = res.json()["run_id"]
        pid = int((local_host.workspace_dir / "runs" / run_id / "pid").read_text().split()[0])
        groups.append(pid)
        return run_id

    yield launch
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


class Watch:
    """`dflashctl status --watch --json` as its own process: its JSON lines as they come."""

    def __init__(self, run_id: str, *extra: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "dflashctl", "status", run_id, "--watch", "--json",
                                      "--interval", "0.2", *extra], env=os.environ,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict] = []

    def first(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.communicate()
        self.lines.append(json.loads(line))
        return self.lines[-1]

    def end(self, timeout: float = 120) -> tuple[int, str]:
        out, err = self.proc.communicate(timeout=timeout)
        self.lines += [json.loads(x) for x in out.splitlines() if x.strip()]
        return self.proc.returncode, err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def watches():
    made: list[Watch] = []
    yield lambda *a: made.append(Watch(*a)) or made[-1]
    for w in made:
        w.close()


def test_a_watch_whose_run_directory_is_deleted_ends_run_gone_102(local_host, sleeper, watches):
    run_id = sleeper()
    watch = watches(run_id)
    assert watch.first()["run"]["id"] == run_id
    shutil.rmtree(local_host.workspace_dir / "runs" / run_id)
    code, err = watch.end()
    last = watch.lines[-1]
    assert code == 102, (code, err, last)
    assert last["verdict"] == "run-gone" and last["exit_code"] == 102
    assert err.splitlines()[-1] == f"ERROR: run {run_id} is gone from local: its run directory was deleted", err
    assert all(x["verdict"] != "training" or x["run"] is not None for x in watch.lines)


def test_a_watch_whose_run_directory_is_replaced_ends_run_replaced_102(local_host, sleeper, tmp_path, watches):
    run_id = sleeper()
    run_dir = local_host.workspace_dir / "runs" / run_id
    watch = watches(run_id)
    assert watch.first()["run"]["id"] == run_id
    saved = tmp_path / "saved"
    shutil.copytree(run_dir, saved, symlinks=True)
    (saved / "pid").write_text("999999\n")  # another run under the same id: another process group leader
    shutil.rmtree(run_dir)
    saved.rename(run_dir)
    code, err = watch.end()
    assert code == 102 and watch.lines[-1]["verdict"] == "run-replaced", (code, err, watch.lines[-1])
    assert "was replaced by another run" in err.splitlines()[-1], err


def test_follow_of_a_deleted_run_ends_102(local_host, sleeper):
    run_id = sleeper()
    proc = subprocess.Popen([sys.executable, "-m", "dflashctl", "logs", "-f", run_id], env=os.environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: proc.poll() is not None or any(p for p in Path("/proc").glob("[0-9]*")
                                                          if _is_probe_of(p, run_id)), 60, "the follow's probe")
        shutil.rmtree(local_host.workspace_dir / "runs" / run_id)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 102, err
    # deleted after the follow's probe reported: "gone"; before its first report: the probe's own "not found"
    assert err.splitlines()[0] in (f"ERROR: run {run_id} is gone from local: its run directory was deleted",
                                   f"ERROR: run '{run_id}' not found in {local_host.workspace_dir}/runs on local"), err
    assert "Traceback" not in err


def _is_probe_of(p: Path, run_id: str) -> bool:
    try:
        cmdline = p.joinpath("cmdline").read_bytes()
        return run_id.encode() in cmdline and b"--watch" in cmdline
    except OSError:
        return False


# ------------------------------------------------------------------------------ through sshd + pct (the container)


@pytest.fixture
def pve_sleeper(pve, cli, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "job.sh").write_text("sleep 600\n")
    res = cli("launch", "--exec", "--source", str(src), "--no-sentinel", "--name", "sleeper", "--json", "--",
              "sleep", "600")
    assert res.code == 0, res.err
    yield res.json()["run_id"]
    if pve.container_running():
        pve.exec(["sh", "-c", "pkill -KILL -x sleep || true"])  # inside the test's own container only


@pytest.mark.sshd
def test_a_watch_whose_container_is_stopped_ends_container_gone_102(pve, pve_sleeper, watches):
    watch = watches(pve_sleeper)
    assert watch.first()["run"]["id"] == pve_sleeper
    pve.stop_container()
    code, err = watch.end()
    assert code == 102 and watch.lines[-1]["verdict"] == "container-gone", (code, err, watch.lines[-1:])
    assert err.splitlines()[-1].startswith(f"ERROR: run {pve_sleeper} can no longer be watched: "), err
    assert "not running" in err and "Traceback" not in err


@pytest.mark.sshd
def test_a_watch_whose_host_key_changed_ends_host_replaced_2(pve, pve_sleeper, sshd_server, watches, tmp_path,
                                                            monkeypatch):
    # A known_hosts of this test's own: the session's file is shared by every later test of this worker.
    known = tmp_path / "known_hosts"
    shutil.copyfile(os.environ["DFLASHCTL_KNOWN_HOSTS"], known)
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(known))
    watch = watches(pve_sleeper)
    assert watch.first()["run"]["id"] == pve_sleeper
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    entry = f"[{pve.host.address}]:{pve.host.port}"
    known.write_text(f"{entry} {other.with_suffix('.pub').read_text().split(' ', 2)[0]} "
                     f"{other.with_suffix('.pub').read_text().split(' ', 2)[1]}\n")
    sshd_server.drop_connections()  # the watch reconnects, and another machine answers
    code, err = watch.end()
    assert code == 2 and watch.lines[-1]["verdict"] == "host-replaced", (code, err, watch.lines[-1:])
    assert err.splitlines()[-1].startswith(f"ERROR: run {pve_sleeper} can no longer be watched: "), err
    assert "Traceback" not in err


def test_launch_waiting_for_a_run_whose_directory_is_deleted_ends_102_not_a_traceback(local_host, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "job.sh").write_text("sleep 600\n")
    proc = subprocess.Popen([sys.executable, "-m", "dflashctl", "launch", "--exec", "--source", str(src),
                             "--no-sentinel", "--name", "waited", "--wait-for", "exit", "--", "sleep", "600"],
                            env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = local_host.workspace_dir / "runs"
    try:
        wait_until(lambda: proc.poll() is not None or any(p for p in Path("/proc").glob("[0-9]*")
                                                          if _is_probe_of(p, "-waited")), 60, "the wait's probe")
        (run_dir,) = [d for d in runs.iterdir() if d.name.endswith("-waited")]
        pgid = int((run_dir / "pid").read_text().split()[0])
        shutil.rmtree(run_dir)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    with contextlib.suppress(ProcessLookupError, UnboundLocalError):
        os.killpg(pgid, signal.SIGKILL)
    assert proc.returncode == 102, err
    assert "Traceback" not in err and "AssertionError" not in err
    errors = [line for line in err.splitlines() if line.startswith("ERROR: ")]  # after launch's own notes
    assert errors in ([f"ERROR: run {run_dir.name} is gone from local: its run directory was deleted"],
                      [f"ERROR: run '{run_dir.name}' not found in {runs} on local"]), err
