"""Signals before bookkeeping on a full disk (issue 26 part 1): a real tmpfs mounted at the workspace's runs/ and
filled to 100 %, on the `local` host and inside the test container.

- `stop` still ends the run (the signal goes first), says the disk is full and what it could not write, exits 103,
  and leaves no `stopped.tmp-N` / `exit_code.tmp-N` behind;
- `launch` is a one-line refusal naming the filesystem and how much is free, exit 2, and leaves no run directory
  and no `*.tmp-N` behind.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from .treeprog import settle, tree_of, write_tree_prog
from .userprog import local_box, pve_box

pytestmark = pytest.mark.timeout(240)
SIZE = "4m"


def fill(path: Path) -> None:
    """Write path/filler until the filesystem under it refuses another byte."""
    chunk = b"\0" * 65536
    with open(path / "filler", "ab", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
    with open(path / "filler", "ab", buffering=0) as f:  # the last partial block too
        for size in (4096, 512, 1):
            while True:
                try:
                    f.write(b"\0" * size)
                except OSError:
                    break


def leftovers(runs: Path) -> list[str]:
    return sorted(str(p.relative_to(runs)) for p in runs.rglob("*") if ".tmp" in p.name)


@pytest.fixture(params=["local", pytest.param("pve", marks=[pytest.mark.sshd, pytest.mark.slow])])
def full(request, tmp_path):
    """(box, runs dir on this machine): runs/ is a fresh SIZE tmpfs, not yet filled."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if request.param == "local":
        lh = request.getfixturevalue("local_host")
        box = local_box(lh, tmp_path)
    else:
        box = pve_box(request.getfixturevalue("pve"))
    runs = box.ct(f"{box.ct_workspace}/runs")
    runs.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(runs)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {runs}: {mounted.stderr.strip()}")
    try:
        if request.param == "pve":
            seen = box.sh('stat -f -c %T "$1"', [f"{box.ct_workspace}/runs"]).stdout.decode().strip()
            if seen != "tmpfs":  # the container's bind mount does not see mounts made under it afterwards
                made = box.sh('mount -t tmpfs -o size="$2" tmpfs "$1"', [f"{box.ct_workspace}/runs", SIZE])
                if made.returncode != 0:
                    pytest.skip(f"the container does not see the host's tmpfs ({seen}) and cannot mount one: "
                                f"{made.stderr.decode().strip()}")
                subprocess.run(["umount", "-l", str(runs)], check=False)
                runs = Path(f"/proc/{box_init(request)}/root{box.ct_workspace}/runs")
        yield box, runs
    finally:
        subprocess.run(["umount", "-l", str(box.ct(f"{box.ct_workspace}/runs"))], capture_output=True)


def box_init(request) -> int:  # noqa: ANN001
    return request.getfixturevalue("pve").init_pid


def test_stop_on_a_full_disk_still_ends_the_run_and_says_so(full, cli, tmp_path):
    box, runs = full
    src = write_tree_prog(tmp_path / "proj")
    launched = cli("launch", "--source", str(src), "--json", "--exec", "--", "python3", "treeprog.py", "--worker")
    assert launched.code == 0, launched.err
    doc = launched.json()
    tree = tree_of(runs / doc["run_id"])
    fill(runs)
    assert os.statvfs(runs).f_bavail == 0

    stop = cli("stop", "--grace", "5")
    assert stop.code == 103, stop.err
    assert "Traceback" not in stop.err and "the disk is full" in stop.err and "could not write stopped" in stop.err
    settle(box, [tree["pid"], tree["kids"]["worker"]])
    assert leftovers(runs) == []


def test_stop_json_on_a_full_disk_lists_what_it_could_not_write(full, cli, tmp_path):
    box, runs = full
    src = write_tree_prog(tmp_path / "proj")
    doc = cli("launch", "--source", str(src), "--json", "--exec", "--", "python3", "treeprog.py").json()
    tree = tree_of(runs / doc["run_id"])
    fill(runs)
    stop = cli("stop", "--grace", "5", "--json")
    assert stop.code == 103, stop.err
    rec = stop.json()
    assert rec["disk_full"] is True and any(u.startswith("stopped:") for u in rec["unwritten"]), rec
    assert [m["pid"] for m in rec["members"]] == [tree["pid"]]
    settle(box, [tree["pid"]])
    assert leftovers(runs) == []


def test_launch_on_a_full_disk_is_a_one_line_refusal_that_leaves_nothing(full, cli, tmp_path):
    box, runs = full
    fill(runs)
    before = sorted(p.name for p in runs.iterdir())
    src = write_tree_prog(tmp_path / "proj")
    res = cli("launch", "--source", str(src), "--exec", "--", "python3", "treeprog.py")
    assert res.code == 2, res.out + res.err
    errors = [ln for ln in res.err.splitlines() if ln.startswith("ERROR:")]
    assert len(errors) == 1 and "Traceback" not in res.err, res.err
    first = errors[0]
    assert first.startswith("ERROR: no space for a new run"), first
    assert f"mounted at {box.ct_workspace}/runs" in first and "0 B free of 4.0 MiB" in first, first
    assert sorted(p.name for p in runs.iterdir()) == before and leftovers(runs) == []
    again = cli("launch", "--source", str(src), "--exec", "--", "python3", "treeprog.py")  # a retry: still nothing
    assert again.code == 2 and sorted(p.name for p in runs.iterdir()) == before


def test_the_failure_policy_stops_a_run_on_a_full_disk(full, request, cli, tmp_path):
    """The sentinel's policy stop sends its signal before it writes `stopped`: a full disk does not keep the run
    (and its GPUs) going. The GPUs turn idle only once the disk is full, so the stop happens on the full disk."""
    box, runs = full
    gpus = request.getfixturevalue("local_host" if box.name == "local" else "pve")
    gpus.set_gpus([{"memory.used": 70000, "utilization.gpu": 90}])
    src = write_tree_prog(tmp_path / "proj")
    launched = cli("launch", "--source", str(src), "--json", "--idle-limit", "5%@2s", "--exec", "--", "python3",
                   "treeprog.py")
    assert launched.code == 0, launched.err
    run_dir = runs / launched.json()["run_id"]
    tree = tree_of(run_dir)
    fill(runs)
    gpus.set_gpus([{"memory.used": 70000, "utilization.gpu": 0}])
    settle(box, [tree["pid"]], timeout=120)
    assert not (run_dir / "stopped").exists()  # it could not be written: the signal went anyway
    assert leftovers(runs) == []
