"""`launch --exec`: a user's own program (not our trainer) as a run, on the `local` host and through ssh + `pct exec`
(in both of its environment modes: the ssh session's kept, Proxmox's default, and cleared by --keep-env 0): argv
byte-exact, the run's variables and --env, the marker on every process, status / logs / stop / kill-zombies, a
torchrun launch on the CPU; and the one-line errors of bad input. The programs are tests/lifecycle/userprog.py's,
written into a directory per test."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dflashctl.config import parse_inventory

from .conftest import wait_until
from .userprog import Box, local_box, pve_box, watch_until_failure, write_prog

pytestmark = pytest.mark.timeout(240)

ODD_ARGS = ["a b  c", "", "$(touch /tmp/pwned-by-dflashctl)", "`id`", "'\"$HOME\\", "*", "--name", "ünï\u00e9"]


@pytest.fixture(params=["local", pytest.param("pve", marks=[pytest.mark.sshd, pytest.mark.slow]),
                        pytest.param("pve-clear-env", marks=[pytest.mark.sshd, pytest.mark.slow])])
def box(request, tmp_path) -> Box:
    """The local host, or the pve container with `pct exec` keeping the ssh session's environment (Proxmox's default)
    or clearing it (--keep-env 0)."""
    if request.param == "local":
        return local_box(request.getfixturevalue("local_host"), tmp_path)
    if request.param == "pve-clear-env":
        pve = request.getfixturevalue("pve")
        pve.set_env_mode("clear-env")
        return dataclasses.replace(pve_box(pve), name="pve-clear-env")
    return pve_box(request.getfixturevalue("pve"))


@pytest.fixture
def src(tmp_path) -> Path:
    return write_prog(tmp_path / "myproject")


def launch_exec(cli, src: Path, *argv: str, opts: tuple[str, ...] = ()) -> dict:
    res = cli("launch", "--source", str(src), "--json", *opts, "--exec", "--", *argv)
    assert res.code == 0, res.err
    return res.json()


def test_a_users_program_runs_byte_exact_with_the_runs_variables_and_is_stopped(box, cli, src):
    doc = launch_exec(cli, src, "python3", "prog.py", *ODD_ARGS,
                      opts=("--name", "my sweep", "--env", "FOO=bar baz", "--env", "EMPTY=", "--env", "EQ=a=b",
                            "--env", "PYTHONUNBUFFERED=1"))
    run_id, pid = doc["run_id"], doc["pid"]
    rd = box.run_dir(run_id)
    assert doc["run_dir"] == f"{box.ct_workspace}/runs/{run_id}" and doc["config"] is None
    seen = box.seen(rd)
    assert seen["argv"][1:] == ODD_ARGS and seen["pid"] == pid  # no shell in between: byte-exact, the program itself
    env = seen["env"]
    assert env["DFLASH_RUN_ID"] == run_id and env["DFLASH_RUN_DIR"] == doc["run_dir"]
    assert env["FOO"] == "bar baz" and env["EMPTY"] == "" and env["EQ"] == "a=b" and env["PYTHONUNBUFFERED"] == "1"
    assert env.get("HOME")  # from the passwd database where `pct exec` cleared it
    if box.name.startswith("pve"):
        assert env.get("container") == "lxc" and "DFLASHCTL_HOSTS" not in env  # the laptop's never travels
        # --keep-env 0 (lxc-attach --clear-env): nothing of the ssh session; by default (keep-env) it all comes along
        cleared = box.name == "pve-clear-env"
        assert ("SSH_CONNECTION" not in env and "PCT_STATE" not in env) if cleared else "SSH_CONNECTION" in env
    assert seen["cwd"].startswith(f"{box.ct_workspace}/.code/")  # the deployed tree, the version it started in
    assert not Path("/tmp/pwned-by-dflashctl").exists()
    meta = json.loads((rd / "meta.json").read_text())
    assert meta["kind"] == "exec" and meta["argv"] == ["python3", "prog.py", *ODD_ARGS] and meta["name"] == "my sweep"
    assert sorted(meta["env"]) == ["EMPTY", "EQ", "FOO", "PYTHONUNBUFFERED"] and meta["code_hash"]
    assert seen["pgid"] == pid and box.environ(pid)["DFLASH_RUN_ID"] == run_id

    wait_until(lambda: b"step=3 " in (rd / "train.log").read_bytes(), what="three steps in the log")
    status = cli("status", "--json")
    assert status.code == 0, status.err
    sdoc = status.json()
    assert sdoc["run"]["alive"] is True and sdoc["run"]["id"] == run_id
    assert cli("logs", "-n", "2").out.count("step=") == 2
    second = cli("launch", "--source", str(src), "--exec", "--", "python3", "prog.py")
    assert second.code == 2 and f"run {run_id} is still running" in second.err

    stopped = cli("stop", "--json")
    assert stopped.code == 103 and stopped.json()["exit_code"] == 143  # SIGTERM's default action: 128 + 15
    assert not box.alive(pid)
    assert (rd / "exit_code").read_text().strip() == "143" and (rd / "stopped").exists()
    assert "[dflashctl] program exited with code 143" in (rd / "train.log").read_text()
    assert [r["verdict"] for r in cli("runs", "--json").json()["runs"]] == ["stopped"]


def test_kill_zombies_leaves_the_current_program_alone_and_its_helpers_end_with_it(box, cli, src):
    doc = launch_exec(cli, src, "python3", "prog.py", "--helper")
    rd = box.run_dir(doc["run_id"])
    helper = int(wait_until(lambda: (rd / "helper.pid").exists() and (rd / "helper.pid").read_text(),
                            what="the helper's pid"))
    assert box.environ(helper)["DFLASH_RUN_ID"] == doc["run_id"]  # the marker is on every process of the run
    res = cli("kill-zombies", "--yes", "--json")
    assert res.code == 0, res.err
    assert res.json()["current_run"] == doc["run_id"] and res.json()["zombies"] == []
    assert box.alive(doc["pid"]) and box.alive(helper)
    assert cli("stop", "--grace", "5").code == 103
    # the helper left the program's process group (a session of its own), but carries the run's marker: the
    # supervisor ended it before it recorded the exit code, so exit_code present means nothing of the run lives
    assert (rd / "exit_code").exists() and not box.alive(helper) and not box.alive(doc["pid"])
    assert cli("kill-zombies", "--dry-run", "--json").json()["zombies"] == []


def test_a_shell_command_runs_only_when_asked_for(box, cli, src):
    res = cli("launch", "--source", str(src), "--json", "--wait-for", "exit", "--env", "FOO=x y",
              "--shell", 'printf "%s|%s" "$FOO" "$(basename "$PWD")" > "$DFLASH_RUN_DIR/shell.out"')
    assert res.code == 0, res.err
    doc = res.json()
    rd = box.run_dir(doc["run_id"])
    assert (rd / "shell.out").read_text() == f"x y|{Path(json.loads((rd / 'meta.json').read_text())['cwd']).name}"
    meta = json.loads((rd / "meta.json").read_text())
    assert meta["kind"] == "exec" and meta["argv"][1:] == ["-c", meta["shell"]] and meta["argv"][0].endswith("sh")
    assert doc["wait"]["verdict"] == "finished" and doc["wait"]["exit_code"] == 0


def _torchrun(cli, src: Path) -> dict:
    return launch_exec(cli, src, "python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       "ddp.py", opts=("--env", "OMP_NUM_THREADS=1", "--name", "ddp"))


@pytest.mark.slow
def test_a_torchrun_launch_on_the_cpu_where_rank_1_raises_ends_crashed(box, cli, src):
    doc = _torchrun(cli, src)
    rd = box.run_dir(doc["run_id"])
    wait_until(lambda: (rd / "exit_code").exists(), timeout=180, what="torchrun to end and its exit code")
    assert (rd / "exit_code").read_text().strip() == "1"  # torchrun's own exit code after a worker failed
    log = (rd / "train.log").read_text()
    assert "RuntimeError: rank 1 failed on purpose" in log and "world=2" in log
    status = cli("status", "--json")
    assert status.code == 100, status.err
    sdoc = status.json()
    assert sdoc["verdict"] == "crashed" and sdoc["run"]["alive"] is False and sdoc["run"]["exit_code"] == 1
    assert [r["verdict"] for r in cli("runs", "--json").json()["runs"]] == ["crashed"]
    assert cli("kill-zombies", "--dry-run", "--json").json()["zombies"] == []  # no worker outlived the run


@pytest.mark.slow
def test_torchrun_status_names_rank_1_as_the_root_cause(box, cli, src):
    """Depends on the lead's log engine (issue 11 part 4: per-rank workers, torchrun's ChildFailedError summary)."""
    doc = _torchrun(cli, src)
    rd = box.run_dir(doc["run_id"])
    wait_until(lambda: (rd / "exit_code").exists(), timeout=180, what="torchrun to end")
    sdoc = cli("status", "--json").json()
    ranks = {t["name"]: t for t in sdoc["threads"]}
    assert ranks.get("rank1", {}).get("state") == "crashed", sdoc["threads"]
    assert ranks["rank1"]["exception"] == "RuntimeError" and "rank 1 failed on purpose" in ranks["rank1"]["message"]
    assert sdoc.get("root_cause") == "rank1", sdoc


def test_status_watch_exits_105_naming_the_thread_of_a_users_program(box, cli, src):
    """Depends on the lead's log engine (issue 11 part 4) for programs that are not our trainer."""
    doc = launch_exec(cli, src, "python3", "prog.py")
    rd = box.run_dir(doc["run_id"])
    wait_until(lambda: b"step=2 " in (rd / "train.log").read_bytes(), what="two steps")
    code, last, text = watch_until_failure(rd / "crash-thread")
    crashed = {t["name"]: t["exception"] for t in last["threads"] if t["state"] == "crashed"}
    # the watch exits on the first frame with the crashed thread, which may hold only the traceback's first lines
    # (a crash shows the moment its lines arrive): its exception comes once the whole traceback is in the log
    assert code == 105 and set(crashed) == {"worker-1"}, text
    threads = wait_until(lambda: [t for t in cli("status", "--json").json()["threads"] if t["exception"]],
                         what="the exception line of worker-1's traceback")
    assert [(t["name"], t["exception"]) for t in threads] == [("worker-1", "RuntimeError")]
    assert box.alive(doc["pid"])  # degraded: the thread died, the process lives on
    assert cli("stop").code == 103


def test_the_hosts_default_command_is_launched_with_the_args_after_the_dashes(local_host, cli, src, tmp_path,
                                                                             monkeypatch):
    hosts = tmp_path / "cmd-hosts.toml"
    hosts.write_text(local_host.hosts_file.read_text() + 'command = ["python3", "prog.py", "from hosts.toml"]\n')
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(hosts))
    res = cli("launch", "--source", str(src), "--json", "--", "and", "more")
    assert res.code == 0, res.err
    doc = res.json()
    rd = local_host.workspace_dir / "runs" / doc["run_id"]
    box = local_box(local_host, tmp_path)
    assert box.seen(rd)["argv"][1:] == ["from hosts.toml", "and", "more"]
    assert doc["run_id"].endswith("-prog") and json.loads((rd / "meta.json").read_text())["kind"] == "exec"
    assert cli("stop").code == 103


def test_the_hosts_command_key_is_checked_with_file_line_and_key(tmp_path):
    base = '[hosts.a]\ntransport = "local"\nworkspace = "/tmp/w"\n'
    path = tmp_path / "hosts.toml"
    ok = parse_inventory(base + 'command = ["torchrun", "--nproc-per-node", "8", "train.py"]\n', path)
    assert ok.get("a").command == ("torchrun", "--nproc-per-node", "8", "train.py")
    assert parse_inventory(base, path).get("a").command is None
    for bad in ('"python train.py"', "[]", '["python", 3]', '[""]'):
        with pytest.raises(Exception) as e:
            parse_inventory(base + f"command = {bad}\n", path)
        assert str(e.value).startswith(f"{path}:4: [hosts.a] command: must be a non-empty array of strings"), bad


@pytest.mark.parametrize("argv, what", [
    (("--exec",), "--exec was given an empty command"),
    (("--exec", "--", ""), "--exec was given an empty command"),
    (("--shell", "  "), "--shell was given an empty command"),
    (("--shell", "true", "--exec", "--", "true"), "--exec and --shell both give the command"),
    (("--exec", "--config", "x.toml", "--", "python3", "prog.py"), "--config is the bundled trainer's config"),
    (("--exec", "--resume-from", "latest", "--", "python3", "prog.py"), "--resume-from continues a run of the bundled"),
    (("--env", "NOEQUALS", "--exec", "--", "true"), "--env 'NOEQUALS' is not KEY=VALUE"),
    (("--env", "=v", "--exec", "--", "true"), "--env '=v' is not KEY=VALUE"),
    (("--env", "1A=b", "--exec", "--", "true"), "--env '1A=b' is not KEY=VALUE"),
    (("--env", "A B=c", "--exec", "--", "true"), "--env 'A B=c' is not KEY=VALUE"),
    (("--env", "DFLASH_RUN_ID=x", "--exec", "--", "true"), "--env DFLASH_RUN_ID: dflashctl sets it"),
])
def test_bad_input_is_one_line_and_exit_2(local_host, cli, argv, what):
    res = cli("launch", *argv)
    assert res.code == 2, (res.out, res.err)
    assert res.err.startswith(f"ERROR: {what}") and "Traceback" not in res.err
    assert len([ln for ln in res.err.splitlines() if ln.startswith("ERROR:")]) == 1
    assert not (local_host.workspace_dir / "runs").exists()  # refused before anything was touched


def test_exec_without_code_deployed_says_so(local_host, cli):
    res = cli("launch", "--exec", "--", "python3", "prog.py")
    assert res.code == 2 and "no code deployed" in res.err and "deploy --source" in res.err


def test_a_program_that_is_not_there_is_a_failed_launch_with_its_reason(box, cli, src):
    res = cli("launch", "--source", str(src), "--exec", "--", "no-such-program-xyz", "arg")
    assert res.code == 100, res.err
    assert "cannot start 'no-such-program-xyz'" in res.err and "exited with code 127" in res.err
