"""kill-zombies: the decoy scenario on `local` and over ssh + pct, and the pure classifier."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.analysis.zombies import classify
from dflashctl.report import parse_host_gpu, parse_proc

from .zombie_scenario import local_box, pve_box, run_decoy_scenario


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_zombies_kills_only_earlier_runs_on_local(local_host, cli, tmp_path):
    run_decoy_scenario(cli, local_box(tmp_path), tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.both_env_modes
def test_kill_zombies_kills_only_earlier_runs_in_a_container(pve, cli, tmp_path):
    run_decoy_scenario(cli, pve_box(pve), tmp_path)


def proc(pid, run_id=None, state="S", ppid=1, holds_gpu=False, cmd="python -m trainer", elsewhere=False):
    return parse_proc({"pid": pid, "ppid": ppid, "pgid": pid, "state": state, "run_id": run_id, "cmdline": cmd,
                       "starttime": 1000 + pid, "age_s": 10.0, "holds_gpu": holds_gpu, "elsewhere": elsewhere})


def test_a_process_of_another_workspaces_run_of_the_same_id_is_left_alone():
    scan = classify([proc(12, "same", holds_gpu=True, elsewhere=True), proc(13, "same"),
                     proc(14, "cur", elsewhere=True)], current="cur", known_runs={"same", "cur"})
    rows = {r.pid: r for r in scan.rows}
    assert rows[12].action == "skip" and "not in this workspace" in rows[12].why
    assert rows[13].action == "kill" and 14 not in rows


def _marked_sleeper(run_id: str, run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "DFLASH_RUN_ID": run_id, "DFLASH_RUN_DIR": str(run_dir)}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)


def test_a_run_of_the_same_id_in_another_workspace_is_never_a_zombie(local_host, cli, tmp_path):
    """Two workspaces can hold a run of the same id (same name, same second): only the process whose
    DFLASH_RUN_DIR is this workspace's run directory of that id is ours to end."""
    run_id = "20261201-101500-prog"
    ours_dir = local_host.workspace_dir / "runs" / run_id
    ours_dir.mkdir(parents=True)
    (ours_dir / "exit_code").write_text("0\n")  # an earlier run of this workspace, ended
    theirs = _marked_sleeper(run_id, tmp_path / "other-workspace" / "runs" / run_id)
    mine = _marked_sleeper(run_id, ours_dir)
    try:
        res = cli("kill-zombies", "--dry-run", "--json")
        assert res.code == 0, res.err
        rows = {r["pid"]: r for r in json.loads(res.out)["zombies"]}
        assert rows[mine.pid]["action"] == "kill"
        assert theirs.pid not in rows  # holds no GPU: another workspace's process is not even listed
    finally:
        for p in (theirs, mine):
            p.kill()
            p.wait()


def test_unmarked_gpu_holders_are_listed_but_never_killed():
    scan = classify([proc(10, holds_gpu=True), proc(11, "old", holds_gpu=True)], current=None,
                    known_runs={"old"})
    rows = {r.pid: r for r in scan.rows}
    assert rows[10].action == "skip" and "no DFLASH_RUN_ID marker" in rows[10].why
    assert rows[11].action == "kill"


def test_the_current_run_is_never_a_zombie_even_when_named():
    procs = [proc(20, "cur"), proc(21, "cur", ppid=20)]
    assert classify(procs, current="cur", known_runs={"cur"}).rows == []
    with pytest.raises(Exception, match="belongs to the current run"):
        classify(procs, current="cur", named_pids=(21,), known_runs={"cur"})


def test_host_gpu_memory_is_mapped_to_container_pids():
    host = {"error": None, "procs": [
        {"pid": 91451, "ns_pid": 30, "used_memory_mib": 88000.0, "gpu_uuid": "GPU-0", "in_container": True},
        {"pid": 91452, "ns_pid": 30, "used_memory_mib": 46000.0, "gpu_uuid": "GPU-5", "in_container": True},
        {"pid": 5000, "ns_pid": None, "used_memory_mib": 1000.0, "gpu_uuid": "GPU-1", "in_container": False},
    ]}
    scan = classify([proc(30, "old", holds_gpu=True), proc(31, holds_gpu=False)], current="new",
                    host_gpu=parse_host_gpu(host), known_runs={"old", "new"})
    rows = {r.pid: r for r in scan.rows}
    assert rows[30].gpu_mib == 134000.0 and rows[30].action == "kill"
    assert 31 not in rows


def test_a_gpu_holder_seen_only_from_the_host_is_listed_not_killed():
    host = {"error": None, "procs": [{"pid": 7, "ns_pid": 40, "used_memory_mib": 500.0, "gpu_uuid": "G",
                                      "in_container": True}]}
    rows = {r.pid: r for r in classify([proc(40)], current=None, host_gpu=parse_host_gpu(host),
                                                 known_runs=set()).rows}
    assert rows[40].action == "skip" and rows[40].gpu_mib == 500.0


def test_unknown_named_pid_is_a_usage_error():
    with pytest.raises(Exception, match="pid 999 not found"):
        classify([proc(1)], current=None, named_pids=(999,))


def _host_pid(ns_inode: str, ns_pid: int) -> int:
    """The host pid of container pid ns_pid (NSpid's last field, in that pid namespace)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != ns_inode:
                continue
            for line in Path(f"/proc/{name}/status").read_text().splitlines():
                if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                    return int(name)
        except OSError:
            continue
    raise AssertionError(f"no host pid for container pid {ns_pid}")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_host_side_gpu_processes_are_mapped_into_the_container(pve, cli):
    """nvidia-smi inside LXC lists no processes: the host's list, mapped through /proc/PID/cgroup
    (lxc/CTID) and NSpid, names the container pids and their GPU memory."""
    unified = Path("/sys/fs/cgroup/unified")
    root = unified if unified.is_dir() else Path("/sys/fs/cgroup")
    if not os.access(root, os.W_OK):
        pytest.skip(f"cannot create a cgroup under {root} (not root or read-only): the lxc/CTID mapping needs one")
    runs = pve.workspace_dir / "dflash" / "runs"
    (runs / "20200101-000000-old").mkdir(parents=True)
    box = pve_box(pve)
    old = box.start("sleeper", "20200101-000000-old", "gpu-old", f"{pve.host.workspace}/runs/20200101-000000-old")[0]
    anon = box.start("sleeper", None, "gpu-anon")[0]
    init = pve.init_pid
    ns = os.readlink(f"/proc/{init}/ns/pid")
    h_old, h_anon = _host_pid(ns, old), _host_pid(ns, anon)
    base = root / f"dflash-test-{os.getpid()}-{pve.ctid}"
    cg = base / "lxc" / str(pve.ctid)
    try:
        cg.mkdir(parents=True)
        for hp in (h_old, h_anon):
            (cg / "cgroup.procs").write_text(str(hp))
        pve.set_gpus([{"memory.used": 92000, "utilization.gpu": 0}],
                     processes=[{"pid": h_old, "used_memory": 88000, "gpu": 0},
                                {"pid": h_anon, "used_memory": 4000, "gpu": 0},
                                {"pid": os.getpid(), "used_memory": 10, "gpu": 0}])  # not in the container
        doc = cli("kill-zombies", "--dry-run", "--json").json()
        rows = {z["pid"]: z for z in doc["zombies"]}
        assert rows[old]["gpu_mib"] == 88000 and rows[old]["action"] == "kill"
        assert rows[anon]["gpu_mib"] == 4000 and rows[anon]["action"] == "skip"
        assert "no DFLASH_RUN_ID marker" in rows[anon]["why"]
        assert cli("kill-zombies", "--yes", "--json").code == 0
        assert box.wait_gone(old) and box.alive(anon)
    finally:
        pve.exec(["kill", "-9", str(old), str(anon)])
        box.wait_gone(anon)
        for d in (cg, cg.parent, base):
            with contextlib.suppress(OSError):
                d.rmdir()


@pytest.mark.timeout(120)
def test_gpu_memory_of_processes_on_a_host_without_container(local_host, cli, tmp_path):
    """Without LXC, nvidia-smi's pids are the host's own: GPU MiB per process straight from it."""
    (local_host.workspace_dir / "runs" / "20200101-000000-old").mkdir(parents=True)
    box = local_box(tmp_path)
    old = box.start("sleeper", "20200101-000000-old", "old",
                    str(local_host.workspace_dir / "runs" / "20200101-000000-old"))[0]
    anon = box.start("sleeper", None, "anon")[0]
    try:
        local_host.set_gpus([{"memory.used": 92000}], processes=[{"pid": old, "used_memory": 88000, "gpu": 0},
                                                                 {"pid": anon, "used_memory": 4000, "gpu": 0}])
        rows = {z["pid"]: z for z in cli("kill-zombies", "--dry-run", "--json").json()["zombies"]}
        assert rows[old]["gpu_mib"] == 88000 and rows[old]["action"] == "kill"
        assert rows[anon]["gpu_mib"] == 4000 and rows[anon]["action"] == "skip"
    finally:
        for pid in (old, anon):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


def _reaper(spec: dict) -> dict:
    import subprocess
    import sys

    from harness.agentpyz import archive_path, spec_stdin

    from dflashctl.remote.agentcall import parse_replies

    res = subprocess.run([sys.executable, archive_path(), "kill"], input=spec_stdin(spec), capture_output=True,
                         timeout=60)
    return parse_replies(res.stdout)[-1]["results"]


def test_a_pid_reused_since_the_scan_is_not_signalled(tmp_path):
    box = local_box(tmp_path)
    pid = box.start("sleeper", "20200101-000000-old", "reused", str(tmp_path / "runs" / "20200101-000000-old"))[0]
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        start = int(stat[stat.rfind(")") + 2:].split()[19])
        wrong_start = _reaper({"targets": [{"pid": pid, "starttime": start - 1, "marker": "20200101-000000-old"}],
                               "grace_s": 1})
        wrong_marker = _reaper({"targets": [{"pid": pid, "starttime": start, "marker": "20200101-000000-new"}],
                                "grace_s": 1})
        assert wrong_start[str(pid)]["outcome"] == "changed" and wrong_marker[str(pid)]["outcome"] == "changed"
        assert box.alive(pid)
        right = _reaper({"targets": [{"pid": pid, "starttime": start, "marker": "20200101-000000-old"}],
                         "grace_s": 5})
        assert right[str(pid)]["outcome"] == "terminated" and box.wait_gone(pid)
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
