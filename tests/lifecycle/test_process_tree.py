"""A run is its process tree (issue 24 part 3), on the `local` host and inside the test container:

- the wrapper a person starts by hand (`bash -c 'cd … && python3 prog.py > log 2>&1; …' &`: a non-interactive shell
  wrapping the trainer, neither leading a process group), adopted by the shell's pid: adopt names both, `stop` ends
  both;
- an adopted trainer with a DataLoader-like child: its child outlives it → the run is not STOPPED, status names the
  survivor, `stop` ends it;
- a survivor planted after `stop` (a process carrying the run's marker) is named by status and listed and ended by
  `kill-zombies`, which touches nothing outside the tree;
- a launched program whose child setsid's out of its group and is reparented to init: `stop` finds it by the marker.
"""

from __future__ import annotations

import json
import shlex

import pytest

from .conftest import wait_until
from .treeprog import settle, tree_of, write_tree_prog
from .userprog import Box, hand_box

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(params=["local", pytest.param("pve", marks=[pytest.mark.sshd, pytest.mark.slow])])
def box(request, tmp_path):
    yield from hand_box(request, tmp_path, write_tree_prog)


def by_hand(box: Box, script: str, *args: str) -> int:
    """Run script (sh) in the program's directory, as a person would; it echoes the pid to adopt."""
    res = box.sh(f'cd "$1" && py="$2" && shift 2 && {script}', [box.home, box.python, *args])
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.split()[-1])
    box.started.append(pid)
    return pid


WRAPPER = ("bash -c 'cd \"$0\" && \"$1\" treeprog.py \"$2\" > hand.log 2>&1; echo wrapper-done >> hand.log' "
           '"$PWD" "$py" "${1:---}" </dev/null >/dev/null 2>&1 & echo $!')
PLAIN = '"$py" treeprog.py "$@" > hand.log 2>&1 </dev/null & echo $!'


def pids_of(tree: dict) -> list[int]:
    return [tree["pid"], *tree["kids"].values()]


def test_stop_ends_an_adopted_shell_wrapper_and_the_trainer_it_waits_for(box, cli):
    shell = by_hand(box, WRAPPER)
    tree = tree_of(box.ct(box.home))
    trainer = tree["pid"]
    box.started.append(trainer)
    assert trainer != shell and tree["pgid"] != shell and tree["pgid"] != trainer  # neither leads a group
    res = cli("adopt", "--pid", str(shell), "--log", "hand.log", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert [t["pid"] for t in doc["tree"]] == [trainer] and doc["writes_log"] == [trainer]
    assert doc["found"].startswith(f"pid {shell} is `bash -c") and f"its child {trainer} `" in doc["found"]
    assert doc["found"].endswith("writes the log — adopting both"), doc["found"]
    human = cli("status", "--json").json()
    assert human["run"]["alive"] is True and human["verdict"] == "training"

    stop = cli("stop", "--grace", "5", "--json")
    assert stop.code == 103, stop.err
    sdoc = stop.json()
    assert sorted(m["pid"] for m in sdoc["members"]) == sorted([shell, trainer]) and sdoc["survivors"] == []
    assert all(m["cmdline"] for m in sdoc["members"])  # read before any signal: the shell exits with its child
    settle(box, [shell, trainer])
    after = cli("status", "--json")
    assert after.json()["verdict"] == "stopped" and after.code == 103


def test_an_adopted_trainers_child_that_outlives_it_keeps_the_run_from_stopped(box, cli):
    trainer = by_hand(box, PLAIN, "--worker")
    worker = tree_of(box.ct(box.home))["kids"]["worker"]
    box.started.append(worker)
    res = cli("adopt", "--pid", str(trainer), "--log", "hand.log", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert [t["pid"] for t in doc["tree"]] == [worker]
    assert doc["writes_log"] == [trainer, worker]  # a worker inherits its parent's stdout: both hold the log

    box.kill(trainer)  # the trainer dies; its worker, reparented, lives on
    wait_until(lambda: not box.alive(trainer), what="the adopted trainer to die")
    assert box.alive(worker)
    status = cli("status", "--json").json()
    assert status["run"]["alive"] is True and status["verdict"] != "stopped"
    assert [s["pid"] for s in status["run"]["survivors"]] == [worker]
    assert any(f"pid {worker}" in r for r in status["reasons"]), status["reasons"]
    assert cli("kill-zombies", "--yes", "--json").json()["zombies"] == []  # the current run's own: protected

    stop = cli("stop", "--grace", "5", "--json")
    assert stop.code == 103, stop.err
    assert [m["pid"] for m in stop.json()["members"]] == [worker]
    settle(box, [worker])
    assert cli("status", "--json").json()["verdict"] == "stopped"


def test_a_survivor_planted_after_stop_is_named_and_ended_by_kill_zombies(box, cli):
    shell = by_hand(box, WRAPPER)
    tree = tree_of(box.ct(box.home))
    box.started.append(tree["pid"])
    run = cli("adopt", "--pid", str(shell), "--log", "hand.log", "--json").json()
    assert cli("stop", "--grace", "5").code == 103
    settle(box, [shell, tree["pid"]])
    run_dir = f"{box.ct_workspace}/runs/{run['run_id']}"
    planted = by_hand(box, f'DFLASH_RUN_ID={shlex.quote(run["run_id"])} DFLASH_RUN_DIR={shlex.quote(run_dir)} '
                           '"$py" -c "import time; time.sleep(600)" </dev/null >/dev/null 2>&1 & echo $!')
    stranger = by_hand(box, '"$py" -c "import time; time.sleep(600)" </dev/null >/dev/null 2>&1 & echo $!')

    status = cli("status", "--json")
    sdoc = status.json()
    assert sdoc["verdict"] != "stopped" and [s["pid"] for s in sdoc["run"]["survivors"]] == [planted], sdoc
    assert status.code != 103
    assert [r["pid"] for r in cli("runs", "--json").json()["runs"][0]["survivors"]] == [planted]

    dry = cli("kill-zombies", "--dry-run", "--json").json()
    assert [(z["pid"], z["action"]) for z in dry["zombies"]] == [(planted, "kill")], dry
    assert "survivor of run" in dry["zombies"][0]["why"]
    res = cli("kill-zombies", "--yes", "--json")
    assert res.code == 0 and res.json()["ended"] == 1, res.out + res.err
    settle(box, [planted])
    assert box.alive(stranger)  # outside the tree: never touched
    assert cli("status", "--json").json()["verdict"] == "stopped"


def test_stop_ends_a_launched_programs_child_that_left_its_group(box, cli, tmp_path):
    src = write_tree_prog(tmp_path / "proj")
    launched = cli("launch", "--source", str(src), "--json", "--exec", "--", "python3", "treeprog.py", "--escape",
                   "--worker")
    assert launched.code == 0, launched.err
    doc = launched.json()
    tree = tree_of(box.run_dir(doc["run_id"]))
    escaped, worker = tree["kids"]["escaped"], tree["kids"]["worker"]
    assert box.alive(escaped) and box.environ(escaped)["DFLASH_RUN_ID"] == doc["run_id"]
    stat = box.sh('cat "/proc/$1/stat"', [str(escaped)]).stdout.decode()
    assert int(stat[stat.rfind(")") + 2:].split()[2]) != tree["pgid"]  # out of the run's group
    stop = cli("stop", "--grace", "5", "--json")
    assert stop.code == 103, stop.err
    assert {escaped, worker, tree["pid"]} <= {m["pid"] for m in stop.json()["members"]}
    settle(box, [escaped, worker, tree["pid"]])
    assert cli("status", "--json").json()["verdict"] == "stopped"


def test_stop_kills_a_tree_member_that_ignores_sigterm_after_the_grace(box, cli):
    shell = by_hand(box, WRAPPER, "--ignore-term")
    tree = tree_of(box.ct(box.home))
    box.started.append(tree["pid"])
    assert cli("adopt", "--pid", str(shell), "--log", "hand.log").code == 0
    stop = cli("stop", "--grace", "1", "--json")
    assert stop.code == 103, stop.err
    outcomes = {m["pid"]: m["outcome"] for m in stop.json()["members"]}
    assert outcomes[tree["pid"]] == "killed" and stop.json()["escalated"] is True
    settle(box, [shell, tree["pid"]])


def test_adopt_says_what_it_found(box, cli):
    """The human output names the shell, its child and which one writes the log."""
    shell = by_hand(box, WRAPPER)
    tree = tree_of(box.ct(box.home))
    box.started.append(tree["pid"])
    res = cli("adopt", "--pid", str(shell), "--log", "hand.log")
    assert res.code == 0, res.err
    line = next(ln for ln in res.out.splitlines() if "found" in ln)
    assert f"pid {shell} is `bash -c" in line and f"its child {tree['pid']}" in line
    assert "writes the log — adopting both" in line
    meta = json.loads((box.run_dir(cli("runs", "--json").json()["runs"][0]["id"]) / "meta.json").read_text())
    assert [t["pid"] for t in meta["adopted"]["tree"]] == [tree["pid"]]
    assert cli("stop", "--grace", "5").code == 103
