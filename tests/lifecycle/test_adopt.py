"""`adopt`: a program started by hand (`setsid nohup python prog.py > log 2>&1 &`, no marker) becomes the current
run, on the `local` host and inside the test container: status / logs / runs see it, its end is noticed, `stop` ends
it, `kill-zombies` never touches it, a reused pid is never signalled; and every bad input is one line."""

from __future__ import annotations

import json

import pytest

from dflashctl.remote import agentcall, agentpack

from .conftest import FAKE_TRAINER, wait_until
from .userprog import Box, hand_box, local_box, watch_until_failure, write_prog

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["local", pytest.param("pve", marks=[pytest.mark.sshd, pytest.mark.slow])])
def box(request, tmp_path):
    yield from hand_box(request, tmp_path, write_prog)


def by_hand(box: Box, *args: str, log: str = "hand.log") -> int:
    pid = box.start_by_hand(box.home, *args, log=log)
    box.started.append(pid)
    return pid


def adopt(cli, pid: int, log: str, *more: str) -> dict:
    res = cli("adopt", "--pid", str(pid), "--log", log, "--json", *more)
    assert res.code == 0, res.err
    return res.json()


def test_an_adopted_program_is_the_live_current_run_until_it_crashes(box, cli):
    pid = by_hand(box, "train")
    assert "DFLASH_RUN_ID" not in box.environ(pid)  # started by hand: no marker
    doc = adopt(cli, pid, "hand.log", "--name", "by hand")  # relative: to the process's working directory
    run_id = doc["run_id"]
    assert doc["log"] == f"{box.home}/hand.log" and doc["pid"] == pid and doc["leads_group"] is True
    rd = box.run_dir(run_id)
    meta = json.loads((rd / "meta.json").read_text())
    assert meta["kind"] == "adopted" and meta["name"] == "by hand" and meta["argv"][1:] == ["prog.py", "train"]
    assert meta["adopted"]["pid"] == pid and meta["adopted"]["starttime"] > 0 and meta["cwd"] == box.home
    assert (rd / "pid").read_text().strip() == str(pid)
    assert (rd / "train.log").is_symlink() and str((rd / "train.log").readlink()) == f"{box.home}/hand.log"
    assert (rd.parent / "latest").readlink().name == run_id

    hand_log = box.ct(f"{box.home}/hand.log")  # train.log links to it by its path in the container
    wait_until(lambda: b"step=3 " in hand_log.read_bytes(), what="steps in the adopted log")
    status = cli("status", "--json")
    assert status.code == 0, status.err
    sdoc = status.json()
    assert sdoc["run"]["id"] == run_id and sdoc["run"]["alive"] is True and sdoc["verdict"] == "training"
    assert "step=" in cli("logs", "-n", "3").out  # the probe reads the adopted log
    (listed,) = cli("runs", "--json").json()["runs"]
    assert listed["id"] == run_id and listed["alive"] is True and listed["last_step"] >= 3

    (box.ct(box.home) / "crash-main").touch()
    wait_until(lambda: not box.alive(pid), what="the adopted program to die")
    after = cli("status", "--json")
    adoc = after.json()
    assert adoc["run"]["alive"] is False and adoc["verdict"] == "crashed" and after.code == 100, adoc
    assert "RuntimeError" in (adoc.get("final_exception") or "")  # judged from the adopted log
    assert not (rd / "exit_code").exists()  # nobody can wait for a process that is not its child: unknown
    stop = cli("stop")
    assert stop.code == 2 and "has ended" in stop.err


def test_stop_ends_a_live_adopted_run_and_records_it(box, cli):
    pid = by_hand(box, "train")
    run_id = adopt(cli, pid, f"{box.home}/hand.log")["run_id"]
    res = cli("stop", "--grace", "5", "--json")
    assert res.code == 103, res.err
    doc = res.json()
    assert doc["run"] == run_id and doc["pid"] == pid and doc["exit_code"] == 143 and doc["recorded_by"] == "stop"
    assert not box.alive(pid)
    rd = box.run_dir(run_id)
    assert (rd / "exit_code").read_text().strip() == "143" and (rd / "stopped").exists()
    assert [r["verdict"] for r in cli("runs", "--json").json()["runs"]] == ["stopped"]
    again = cli("adopt", "--pid", str(pid), "--log", f"{box.home}/hand.log")
    assert again.code == 102 and ("does not exist" in again.err or "has exited" in again.err)  # gone (or defunct)


def test_kill_zombies_never_touches_the_adopted_current_run(box, cli):
    pid = by_hand(box, "train")
    run_id = adopt(cli, pid, f"{box.home}/hand.log")["run_id"]
    res = cli("kill-zombies", "--yes", "--json")
    assert res.code == 0, res.err
    assert res.json()["current_run"] == run_id and all(z["pid"] != pid for z in res.json()["zombies"])
    named = cli("kill-zombies", "--pid", str(pid), "--yes")
    assert named.code == 2 and "current run" in named.err
    assert box.alive(pid)
    launched = cli("launch", "--source", str(FAKE_TRAINER))  # a second run beside it is refused, as a launch is
    assert launched.code == 2 and f"run {run_id} is still running" in launched.err
    assert cli("stop").code == 103


@pytest.mark.parametrize("field", ["starttime", "cmdline"])
def test_a_reused_pid_is_never_signalled(box, cli, field):
    """The recorded identity no longer matches the process holding the pid (as after a reuse): the run is over for
    every reader, and neither stop nor kill-zombies signals that process."""
    pid = by_hand(box, "train")
    run_id = adopt(cli, pid, f"{box.home}/hand.log")["run_id"]
    meta_path = box.run_dir(run_id) / "meta.json"
    meta = json.loads(meta_path.read_text())
    if field == "starttime":
        meta["adopted"]["starttime"] -= 7
    else:
        meta["adopted"]["cmdline"] = [*meta["adopted"]["cmdline"][:-1], "something-else"]
    meta_path.write_text(json.dumps(meta))
    sdoc = cli("status", "--json").json()
    assert sdoc["run"]["alive"] is False
    stop = cli("stop", "--grace", "1")
    assert stop.code == 2 and "Traceback" not in stop.err
    assert cli("kill-zombies", "--yes", "--json").code == 0
    assert box.alive(pid)
    # the reaper itself, asked straight (as if the probe had seen the run alive a moment before): not signalled
    spec = {"run_dir": f"{box.ct_workspace}/runs/{run_id}", "run_id": run_id, "grace_s": 1,
            "identity": meta["adopted"]}
    installed = f"{box.ct_workspace}/.agent/{agentpack.sha256()}.pyz"  # by the commands above
    res = box.sh('printf "%s\\n" "$3" | exec "$1" "$2" stop', [box.python, installed, json.dumps(spec)])
    assert res.returncode == 0 and b'"outcome": "not-running"' in res.stdout, res
    assert box.alive(pid) and not (box.run_dir(run_id) / "stopped").exists()


def test_bad_adopt_input_is_one_line(box, cli):
    pid = by_hand(box, "train")
    cases = [
        (("--pid", "999999", "--log", "x.log"), 102, "process 999999 does not exist"),
        (("--pid", "0", "--log", "x.log"), 2, "--pid must be a process id"),
        (("--pid", "1", "--log", "x.log"), 2, "pid 1 is the container's init"),
        (("--pid", "abc", "--log", "x.log"), 2, "Invalid value for '--pid'"),
        (("--pid", str(pid), "--log", "no-such.log"), 2, f"log {box.home}/no-such.log does not exist"),
        (("--pid", str(pid), "--log", box.home), 2, f"log {box.home} is not a regular file"),
    ]
    for argv, code, what in cases:
        res = cli("adopt", *argv)
        assert res.code == code and what in res.err, (argv, res.code, res.err)
        assert res.err.startswith("ERROR:") and "Traceback" not in res.err, argv
    assert [p for p in box.ct(box.ct_workspace).glob("runs/*")] == []  # nothing was recorded
    run_id = adopt(cli, pid, "hand.log")["run_id"]
    twice = cli("adopt", "--pid", str(pid), "--log", "hand.log")
    assert twice.code == 2 and f"pid {pid} is already adopted as run {run_id}" in twice.err
    other = by_hand(box, "train", log="other.log")
    beside = cli("adopt", "--pid", str(other), "--log", "other.log")
    assert beside.code == 2 and f"run {run_id} is still running" in beside.err
    assert cli("stop").code == 103


def test_a_process_of_a_launched_run_cannot_be_adopted(box, cli, tmp_path):
    src = write_prog(tmp_path / "proj")
    launched = cli("launch", "--source", str(src), "--json", "--exec", "--", "python3", "prog.py")
    assert launched.code == 0, launched.err
    doc = launched.json()
    res = cli("adopt", "--pid", str(doc["pid"]), "--log", f"{doc['run_dir']}/train.log")
    assert res.code == 2 and f"pid {doc['pid']} is part of run {doc['run_id']}, which dflashctl launched" in res.err
    assert cli("stop").code == 103


def test_adopting_over_a_launch_race_is_refused_under_the_lock(local_host, cli, tmp_path):
    """The launcher re-checks under the launch lock: a run that became live after adopt's look is refused."""
    box = local_box(local_host, tmp_path)
    home = tmp_path / "hand"
    write_prog(home)
    pid = box.start_by_hand(str(home), "train")
    try:
        src = write_prog(tmp_path / "proj")
        launched = cli("launch", "--source", str(src), "--json", "--exec", "--", "python3", "prog.py")
        assert launched.code == 0, launched.err
        with local_host.connect() as t:
            res = agentcall.call(t, "adopt", {"runs_dir": str(local_host.workspace_dir / "runs"),
                                              "base_id": "20200101-000000-race", "pid": pid, "starttime": None,
                                              "log": str(home / "hand.log"), "meta": {}})
        assert res["error"] == "run-alive" and res["run_id"] == launched.json()["run_id"]
        assert not (local_host.workspace_dir / "runs" / "20200101-000000-race").exists()
        assert cli("stop").code == 103
    finally:
        box.kill(pid)


def test_status_watch_follows_an_adopted_run_and_exits_105_when_its_thread_dies(box, cli):
    pid = by_hand(box, "train")
    run_id = adopt(cli, pid, "hand.log")["run_id"]
    code, last, text = watch_until_failure(box.ct(box.home) / "crash-thread")
    crashed = {t["name"]: t["exception"] for t in last["threads"] if t["state"] == "crashed"}
    # the watch exits on the first frame with the crashed thread, which may hold only the traceback's first lines
    # (a crash shows the moment its lines arrive): its exception comes once the whole traceback is in the log
    assert code == 105 and set(crashed) == {"worker-1"}, text
    threads = wait_until(lambda: [t for t in cli("status", "--json").json()["threads"] if t["exception"]],
                         what="the exception line of worker-1's traceback")
    assert [(t["name"], t["exception"]) for t in threads] == [("worker-1", "RuntimeError")]
    assert run_id in text and box.alive(pid)
    assert cli("stop").code == 103 and not box.alive(pid)
