"""The run lifecycle on the `local` host: deploy -> launch -> refused second launch -> logs -> stop,
plus the failures a launch must report instead of calling them launched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.foreground import FOREGROUND

from .conftest import FAKE_TRAINER, alive, marker_of, wait_until, write_config

pytestmark = pytest.mark.timeout(120)


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_deploy_is_idempotent_and_notices_changes(local_host, cli, tmp_path):
    src = tmp_path / "trainer"
    src.mkdir()
    for f in FAKE_TRAINER.rglob("*.py"):
        (src / f.name).write_bytes(f.read_bytes())
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"cache")

    assert cli("deploy", "--check", "--source", str(src)).code == 1  # nothing deployed yet
    first = cli("deploy", "--source", str(src), "--json")
    assert first.code == 0 and first.json()["changed"] is True
    code = local_host.workspace_dir / "code"
    assert code.is_symlink() and (code / ".dflash-code-hash").read_text().strip() == first.json()["hash"]
    assert not (code / "trainer" / "__pycache__").exists()  # caches never ship
    again = cli("deploy", "--source", str(src), "--json").json()
    assert again["changed"] is False and again["bytes_sent"] == 0
    assert cli("deploy", "--check", "--source", str(src)).code == 0

    (src / "__main__.py").write_text((src / "__main__.py").read_text() + "\n# edited\n")
    stale = cli("deploy", "--check", "--source", str(src))
    assert stale.code == 1 and "stale" in stale.out
    assert cli("deploy", "--source", str(src), "--json").json()["changed"] is True
    assert "# edited" in (code / "trainer" / "__main__.py").read_text()


def test_deploy_check_notices_a_file_edited_in_place_in_the_container(local_host, cli):
    cli("deploy", "--source", str(FAKE_TRAINER))
    deployed = local_host.workspace_dir / "code" / "trainer" / "__main__.py"
    deployed.write_text(deployed.read_text() + "# hand edit\n")
    res = cli("deploy", "--check", "--source", str(FAKE_TRAINER))
    assert res.code == 1 and "edited in place" in res.out
    assert cli("deploy", "--source", str(FAKE_TRAINER), "--json").json()["changed"] is True


def test_launch_refuses_a_second_run_then_logs_and_stop(local_host, cli, tmp_path):
    ws = local_host.workspace_dir
    first = cli("launch", "--source", str(FAKE_TRAINER), "--name", "first", "--wait-for", "step", "--json")
    assert first.code == 0, first.err
    doc = first.json()
    run_id, pid = doc["run_id"], doc["pid"]
    assert "deployed" in doc["notes"][0]  # the code was not there: launch deployed it and said so
    assert doc["wait"]["reached"] and doc["wait"]["line"].startswith("step=")
    assert alive(pid) and marker_of(pid) == run_id
    assert (ws / "runs" / "latest").resolve() == (ws / "runs" / run_id).resolve()
    assert os.getpgid(pid) == pid  # the trainer leads its own process group: stop signals all of it

    changed = tmp_path / "trainer"
    shutil.copytree(FAKE_TRAINER, changed)
    (changed / "__main__.py").write_text((changed / "__main__.py").read_text() + "# newer code\n")
    second = cli("launch", "--source", str(changed), "--name", "second")
    assert second.code == 2 and f"run {run_id} is still running" in second.err
    assert len([p for p in (ws / "runs").iterdir() if p.name != "latest"]) == 1  # nothing was created
    assert cli("deploy", "--check", "--source", str(FAKE_TRAINER)).code == 0  # nor deployed: refused = untouched

    logs = cli("logs", "-n", "2")
    assert logs.code == 0 and len(logs.out.splitlines()) == 2 and all("step=" in line for line in logs.out.splitlines())

    stopped = cli("stop", run_id)
    assert stopped.code == 103 and "exit code 143" in stopped.out
    assert not alive(pid)
    rd = ws / "runs" / run_id
    assert (rd / "exit_code").read_text().strip() == "143" and (rd / "stopped").exists()
    assert "SIGTERM received" in (rd / "train.log").read_text()

    again = cli("stop", run_id)
    assert again.code == 2 and "already stopped" in again.err and "Traceback" not in again.err

    runs = cli("runs", "--json").json()
    assert [r["verdict"] for r in runs["runs"]] == ["stopped"]


def test_run_dirs_are_distinct_and_untouched_by_later_runs(local_host, cli, tmp_path):
    cfg = write_config(tmp_path / "short.toml", mode="train", steps=3, step_s=0.05)
    a = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "same", "--wait-for", "exit",
            "--json")
    assert a.code == 0, a.err
    a_dir = Path(a.json()["run_dir"])
    before = tree_digest(a_dir)
    b = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "same", "--wait-for", "exit",
            "--json")
    assert b.code == 0, b.err
    b_dir = Path(b.json()["run_dir"])
    assert a_dir != b_dir and a_dir.parent == b_dir.parent
    assert tree_digest(a_dir) == before  # the earlier run's files are byte-for-byte as they were
    assert (b_dir / "config.toml").read_text() == cfg.read_text()
    meta = json.loads((b_dir / "meta.json").read_text())
    assert meta["config"]["uploaded"] is True and meta["config"]["source"] == str(cfg.resolve())
    assert meta["id"] == b.json()["run_id"] and meta["code_hash"] and meta["argv"][-2:] == ["--run-dir", str(b_dir)]
    listed = cli("runs", "--json").json()["runs"]
    assert [r["id"] for r in listed] == sorted([a_dir.name, b_dir.name], reverse=True)
    assert all(r["verdict"] == "finished" and r["last_step"] == 3 for r in listed)


def test_a_program_that_exits_at_once_is_reported_failed_with_its_log(local_host, cli, tmp_path, monkeypatch):
    from dflashctl.commands import launch as launch_cmd

    monkeypatch.setattr(launch_cmd, "ALIVE_FOR_S", 600.0)  # its death falls inside the alive window by construction
    monkeypatch.setattr(launch_cmd, "CONFIRM_S", 600.0)
    cfg = write_config(tmp_path / "bad.toml", mode="exit-at-once")
    res = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg))
    assert res.code == 100
    assert "exited with code 3" in res.err
    assert "fatal: cannot open dataset /data/missing.jsonl" in res.err  # the log's first lines, shown
    assert "launched run" not in res.out
    runs = cli("runs", "--json").json()["runs"]
    assert runs[0]["verdict"] == "crashed" and runs[0]["exit_code"] == 3
    scripted = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--json")
    assert scripted.code == 100 and scripted.json()["launched"] is False
    assert "cannot open dataset" in scripted.json()["log_head"]


def test_wait_for_step_reports_a_crash_before_the_first_step(local_host, cli, tmp_path):
    cfg = write_config(tmp_path / "crash.toml", mode="crash-threads")
    res = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--wait-for", "step")
    assert res.code == 100 and "exited with code 1" in res.err and "first lines of the log:" in res.err


def test_logs_errors_prints_whole_thread_tracebacks(local_host, cli, tmp_path):
    cfg = write_config(tmp_path / "crash.toml", mode="crash-threads")
    assert cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--wait-for", "exit").code == 100
    res = cli("logs", "--errors")
    assert res.code == 0
    for i in range(3):
        assert f"thread drafter-{i}" in res.out
    assert res.out.count("Traceback (most recent call last):") == 3
    assert res.out.count('in work') >= 3  # the frames, not just the header line
    assert "RuntimeError: Detected that you are using FX to symbolically trace" in res.out
    doc = cli("logs", "--errors", "--json").json()
    assert {t["thread"] for t in doc["tracebacks"]} == {"drafter-0", "drafter-1", "drafter-2"}
    assert set(doc["error_files"]) == {"drafter-0", "drafter-1", "drafter-2"}


def test_wait_for_exit_times_out_with_101_and_leaves_the_run_running(local_host, cli):
    res = cli("launch", "--source", str(FAKE_TRAINER), "--wait-for", "exit", "--timeout", "1", "--json")
    assert res.code == 101
    doc = res.json()
    assert doc["wait"]["reached"] is False and alive(doc["pid"])
    assert cli("stop", doc["run_id"]).code == 103


def test_follow_streams_until_the_run_ends(local_host, cli, tmp_path):
    cfg = write_config(tmp_path / "short.toml", mode="train", steps=5, step_s=0.1)
    res = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--follow")
    assert res.code == 0
    assert [line for line in res.out.splitlines() if line.startswith("step=")][-1].startswith("step=5 ")
    assert "ended: finished" in res.err


def test_run_name_and_trainer_args_arrive_byte_exact(local_host, cli):
    name = 'my run "quoted" $(touch /tmp/pwned) \'x\''
    extra = ["--note", "a b", "--q", "'\"$HOME`id`", "--empty", ""]
    res = cli("launch", "--source", str(FAKE_TRAINER), "--name", name, "--json", "--", *extra)
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["run_id"].endswith("-my-run-quoted-touch-tmp-pwned-x")  # the id is sanitised
    rd = Path(doc["run_dir"])
    assert json.loads((rd / "meta.json").read_text())["name"] == name  # the name is kept exactly
    seen = wait_until(lambda: (rd / "argv.json").exists() and json.loads((rd / "argv.json").read_text()))
    assert seen["extra"] == extra and seen["run_id"] == doc["run_id"]
    assert cli("stop").code == 103


@pytest.mark.parametrize("name", ["bad\nname", "$$$", "   "])
def test_unusable_run_names_are_refused_in_one_line(local_host, cli, name):
    res = cli("launch", "--source", str(FAKE_TRAINER), "--name", name)
    assert res.code == 2 and res.err.startswith("ERROR: run name") and "Traceback" not in res.err
    assert not (local_host.workspace_dir / "runs").exists() or not any((local_host.workspace_dir / "runs").iterdir())


def test_unknown_run_ids_are_102(local_host, cli):
    cli("deploy", "--source", str(FAKE_TRAINER))
    for argv in (("logs", "nope"), ("stop", "nope"), ("logs", "--errors", "nope"), ("logs", "../etc")):
        res = cli(*argv)
        assert res.code == 102 and res.err.startswith("ERROR: run ") and "not found" in res.err, argv


def test_missing_config_is_a_usage_error(local_host, cli, tmp_path):
    res = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(tmp_path / "nope.toml"))
    assert res.code == 2 and "not found" in res.err


def test_wait_for_step_exits_100_when_threads_crash_before_the_first_step(local_host, cli, tmp_path):
    cfg = write_config(tmp_path / "late.toml", mode="crash-threads", delay_s=3)
    res = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--wait-for", "step", "--json")
    assert res.code == 100
    doc = res.json()  # the report of a run that died before its first step (test_died_at_once.py)
    assert doc["launched"] is False and doc["exit_code"] == 1
    assert "RuntimeError: Detected that you are using FX" in doc["log_head"]  # the error lines, past the first ones
    assert cli("runs", "--json").json()["runs"][0]["verdict"] == "crashed"


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(local_host, cli, tmp_path):
    cfg = write_config(tmp_path / "stubborn.toml", mode="ignore-term", children=1)
    launched = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--json").json()
    res = cli("stop", "--grace", "1", "--json")
    assert res.code == 103
    doc = res.json()
    assert doc["escalated"] is True and doc["exit_code"] == 137  # 128 + SIGKILL, recorded by the supervisor
    assert not alive(launched["pid"])
    assert cli("kill-zombies", "--dry-run", "--json").json()["zombies"] == []  # its child went with the group


def test_stop_records_the_exit_code_itself_when_the_supervisor_is_gone(local_host, cli):
    launched = cli("launch", "--source", str(FAKE_TRAINER), "--json").json()
    rd = Path(launched["run_dir"])
    supervisor = int(Path(f"/proc/{launched['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])  # ppid
    assert marker_of(supervisor) == launched["run_id"]  # the supervisor carries the marker too
    os.kill(supervisor, 9)
    wait_until(lambda: not alive(supervisor), what="supervisor gone")
    res = cli("stop", "--json")
    assert res.code == 103 and res.json()["recorded_by"] == "stop" and res.json()["exit_code"] == 143
    assert (rd / "exit_code").read_text().strip() == "143"


def test_a_crash_is_recorded_though_nobody_is_attached(local_host, cli, tmp_path):
    trigger = tmp_path / "crash-now"
    cfg = write_config(tmp_path / "late.toml", mode="crash-threads", wait_file=str(trigger))
    launched = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--json")
    assert launched.code == 0  # alive at the confirm (it crashes only once told to): launched
    trigger.touch()  # the CLI has returned: nobody is attached when the threads crash
    rd = Path(launched.json()["run_dir"])
    wait_until(lambda: (rd / "exit_code").exists(), what="exit_code written by the supervisor")
    assert (rd / "exit_code").read_text().strip() == "1"
    assert "[dflashctl] trainer exited with code 1" in (rd / "train.log").read_text()
    assert cli("runs", "--json").json()["runs"][0]["verdict"] == "crashed"


def test_requested_gpus_held_by_others_refuse_the_launch(local_host, cli, tmp_path, monkeypatch):
    hosts = tmp_path / "gpu-hosts.toml"
    hosts.write_text(local_host.hosts_file.read_text() + "gpus = { target = [0], drafters = [1] }\n")
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(hosts))
    local_host.set_gpus([{"memory.used": 88283, "utilization.gpu": 0}, {"memory.used": 3}])
    res = cli("launch", "--source", str(FAKE_TRAINER))
    assert res.code == 2 and "GPU 0: 88283 MiB" in res.err and "GPU 1" not in res.err


def test_too_little_free_disk_refuses_the_launch(local_host, cli, monkeypatch):
    from dflashctl.commands import launch as launch_cmd

    monkeypatch.setattr(launch_cmd, "MIN_FREE_MIB", 1e12)
    res = cli("launch", "--source", str(FAKE_TRAINER))
    assert res.code == 2 and "MiB free" in res.err


@pytest.mark.slow
def test_ctrl_c_on_follow_detaches_and_leaves_the_run_running(local_host, cli):
    launched = cli("launch", "--source", str(FAKE_TRAINER), "--json").json()
    proc = subprocess.Popen([*FOREGROUND, sys.executable, "-m", "dflashctl", "logs", "-f"],  # as a terminal would
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith(b"step=") or first.startswith(b"trainer:")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b"keeps running" in err
    assert alive(launched["pid"])
    assert cli("stop").code == 103


def test_stop_reports_the_gpu_memory_it_released(local_host, cli):
    # no sentinel: its GPU readings would take the stand-in's frames meant for the stop's before and after
    launched = cli("launch", "--source", str(FAKE_TRAINER), "--no-sentinel", "--json")
    assert launched.code == 0
    local_host.set_gpu_frames([[{"memory.used": 88283}, {"memory.used": 40000}],   # before the stop
                               [{"memory.used": 3}, {"memory.used": 40000}]])      # after
    res = cli("stop", "--json")
    assert res.code == 103 and res.json()["gpu_released_mib"] == {"0": 88280.0, "1": 0.0}
    text = cli("runs")
    assert text.code == 0


def test_dflashctl_running_inside_a_run_never_lists_itself(local_host, cli):
    old = cli("launch", "--source", str(FAKE_TRAINER), "--json").json()["run_id"]
    cli("stop")
    # e.g. a script started from the run's own environment: the CLI process carries the old marker
    res = subprocess.run([sys.executable, "-m", "dflashctl", "kill-zombies", "--dry-run", "--json"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "DFLASH_RUN_ID": old})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["zombies"] == []


def test_two_launches_at_once_start_exactly_one_run(local_host, cli):
    cli("deploy", "--source", str(FAKE_TRAINER))
    argv = [sys.executable, "-m", "dflashctl", "launch", "--source", str(FAKE_TRAINER), "--json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
             for _ in range(2)]
    codes = sorted(p.wait(timeout=60) for p in procs)
    assert codes == [0, 2]
    runs = [p for p in (local_host.workspace_dir / "runs").iterdir() if p.name != "latest"]
    assert len(runs) == 1
    assert cli("stop").code == 103


def test_wait_for_step_counts_training_step_lines_not_lines_that_merely_name_a_step():
    from dflashctl.analysis.progress import is_training_step

    for line in ("step=12 loss=4.1234 tok/s=1834.2", "step: 10  loss: 2.31", "iter 100: loss 2.3000",
                 "{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.1}", "step=7 tok/s=1200.0"):
        assert is_training_step(line), line
    for line in ("resume: continuing from checkpoint step=285", "eval step=100 acc_len=3.10 tokens_per_forward=2.9",
                 "training stopped by SIGTERM step=285 checkpoint=/w/runs/x/checkpoints/step-00000285.pt",
                 "error_rate=0.01", "trainer starting pid=12 steps=5000 drafters=3"):
        assert not is_training_step(line), line


def test_meta_names_the_install_the_runs_archive_copy_came_from_as_the_docs_say(local_host, cli, tmp_path):
    """usage.md: meta.json `sentinel.sha256` names the archive as the CLI built it (the install
    `<workspace>/.agent/<sha256>.pyz`), not `sha256sum <run>/agent.pyz`; the copy is checked by its own trailer."""
    import io
    import zipfile

    from dflashctl.agent.agentinstall import trailer_holds
    from dflashctl.remote import agentpack

    cfg = write_config(tmp_path / "short.toml", mode="train", steps=2, step_s=0.05)
    ran = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--wait-for", "exit", "--json")
    assert ran.code == 0, ran.err
    run_dir = Path(ran.json()["run_dir"])
    sha = json.loads((run_dir / "meta.json").read_text())["sentinel"]["sha256"]
    copy = (run_dir / "agent.pyz").read_bytes()
    install = Path(local_host.host.workspace) / ".agent" / f"{sha}.pyz"
    assert sha == agentpack.sha256() and install.read_bytes() == copy and trailer_holds(copy)
    assert hashlib.sha256(copy).hexdigest() != sha  # the bytecode the install added
    with zipfile.ZipFile(run_dir / "agent.pyz") as got, zipfile.ZipFile(io.BytesIO(agentpack.archive())) as built:
        assert {n: got.read(n) for n in got.namelist() if not n.endswith(".pyc")} == \
            {n: built.read(n) for n in built.namelist()}
