"""`dflashctl status` over the local transport: a real detached program, the real probe, the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.poll import wait_until

from dflashctl.cli import main
from dflashctl.commands import status as status_cmd
from dflashctl.model import Verdict
from dflashctl.remote import connect
from status.runprog import start_local


@pytest.fixture
def run(local_host) -> Iterator[tuple[Path, subprocess.Popen]]:  # noqa: ANN001 - harness LocalEnv
    run_dir, proc = start_local(local_host.workspace_dir, "20261129-100000-test")
    wait_until(lambda: b"step=3" in (run_dir / "train.log").read_bytes(), what="three steps")
    try:
        yield run_dir, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def status_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict]]:
    capsys.readouterr()
    code = main(["status", *argv, "--json"])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.strip()]


def test_one_shot_status_of_a_training_run(run, local_host, capsys) -> None:  # noqa: ANN001
    local_host.set_gpus([{"memory.used": 40000, "utilization.gpu": 97, "power.draw": 650.0}])
    code, [doc] = status_json(capsys)
    assert code == 0 and doc["schema"] == 1
    assert doc["verdict"] == "training"
    assert doc["run"]["id"] == "20261129-100000-test" and doc["run"]["alive"] is True
    assert doc["progress"]["step"] >= 3 and doc["progress"]["tok/s"] == 1834.2
    assert doc["threads"] == [] and doc["signatures"] == []
    assert [(g["index"], g["utilization_pct"], g["finding"]) for g in doc["gpus"]] == [(0, 97, "busy")]


def test_one_shot_status_names_the_crashed_thread_and_exits_105(run, local_host, capsys) -> None:  # noqa: ANN001
    run_dir, _ = run
    local_host.set_gpus([{"memory.used": 47421, "utilization.gpu": 0}, {"memory.used": 88283, "utilization.gpu": 0}])
    (run_dir / "crash").touch()
    wait_until(lambda: b"RuntimeError: Detected" in (run_dir / "train.log").read_bytes(), what="the traceback")
    code, [doc] = status_json(capsys)
    assert code == 105 and doc["verdict"] == "degraded"
    [t] = doc["threads"]
    assert (t["name"], t["state"], t["exception"]) == ("drafter-0", "crashed", "RuntimeError")
    assert t["message"].startswith("Detected that you are using FX")
    assert [s["id"] for s in doc["signatures"]] == ["compile-thread-race"]
    assert [g["finding"] for g in doc["gpus"]] == ["idle-allocated", "idle-allocated"]
    capsys.readouterr()
    assert main(["status"]) == 105  # the table says the same
    out = capsys.readouterr().out
    for needle in ("DEGRADED", "drafter-0", "RuntimeError", "compile-thread-race", "compile_strategy",
                   "idle-allocated"):
        assert needle in out


def test_finished_run_and_missing_run(run, local_host, capsys) -> None:  # noqa: ANN001
    run_dir, proc = run
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (run_dir / "exit_code").write_text("0\n")
    code, [doc] = status_json(capsys, "20261129-100000-test")
    assert (code, doc["verdict"]) == (0, "finished")
    capsys.readouterr()
    assert main(["status", "no-such-run"]) == 102
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ") and "no-such-run" in err and "Traceback" not in err


def test_watch_stream_sees_training_then_the_crash(run, local_host) -> None:  # noqa: ANN001
    run_dir, _ = run
    views = status_cmd.watch(lambda: connect(local_host.host), interval=0.2)
    try:
        first = next(views)
        assert first.health.verdict == Verdict.TRAINING
        (run_dir / "crash").touch()
        seen = []
        for v in views:
            seen.append(v.health.verdict)
            if v.health.verdict == Verdict.DEGRADED:
                assert v.health.threads[0].name == "drafter-0"
                assert v.health.threads[0].exception == "RuntimeError"
                break
            assert len(seen) < 100, seen
        # the log was followed from its offset: every byte read once
        assert v.log_bytes_scanned == v.log_offset > first.log_offset
    finally:
        views.close()


def test_watch_json_lines_and_exit_on_failure(run, local_host, capsys, monkeypatch) -> None:  # noqa: ANN001
    run_dir, _ = run
    from dflashctl.cli import status as status_cli

    printed = status_cli.print_json

    def print_then_crash(doc: dict) -> None:  # the crash comes after the first line, however slow the machine
        printed(doc)
        (run_dir / "crash").touch()

    monkeypatch.setattr(status_cli, "print_json", print_then_crash)
    code, docs = status_json(capsys, "--watch", "-i", "0.2", "--exit-on-failure")
    assert code == 105
    assert len(docs) >= 2 and all(d["schema"] == 1 for d in docs)
    assert docs[0]["verdict"] == "training" and docs[-1]["verdict"] == "degraded"
    assert docs[-1]["threads"][0]["name"] == "drafter-0"


def test_watch_with_a_gpu_interval_reduces_each_reports_readings_in_json(run, local_host, capsys,  # noqa: ANN001
                                                                         monkeypatch) -> None:
    local_host.set_gpu_frames([[{"memory.used": 40000, "utilization.gpu": 10 + 80 * (k % 2), "power.draw": 300.0}]
                               for k in range(400)])
    from dflashctl.cli import status as status_cli

    printed, docs = status_cli.print_json, []

    def print_then_stop(doc: dict) -> None:  # Ctrl-C once a few reports came
        printed(doc)
        docs.append(doc)
        if len(docs) == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_cli, "print_json", print_then_stop)
    assert main(["status", "--watch", "--json", "-i", "2", "--gpu-interval", "0.2"]) == 0
    if docs[0]["gpus"][0]["power_w"] is None:
        pytest.skip("real NVML present: the scripted nvidia-smi is not what the probe reads here")
    series = docs[-1]["gpus"][0]["series"]
    assert set(series) == {"util", "memory_mib", "power_w"} and len(series["util"]) == 4
    # the first look (one-shot) and the stream's first report: one reading each; then each report's ~10, every
    # nvidia-smi call alternating 10 % / 90 %
    assert [lo == hi for lo, _, hi in series["util"][:2]] == [True, True]
    assert [(lo, hi) for lo, _, hi in series["util"][2:]] == [(10, 90)] * 2
    assert series["memory_mib"][-1] == [40000, 40000, 40000] and series["power_w"][-1] == [300, 300, 300]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["--exit-on-failure"], "--watch"), (["--all", "--watch"], "--all"), (["--interval", "0"], "interval"),
     (["--gpu-interval", "0.2"], "--watch"),
     (["--watch", "--gpu-interval", "0"], "--gpu-interval must be a number from 0.1 to 3600 s, not 0.0"),
     (["--watch", "-i", "1", "--gpu-interval", "2"], "at most --interval (1)")],
)
def test_bad_option_combinations_are_usage_errors(argv: list[str], needle: str, local_host, capsys) -> None:  # noqa: ANN001
    assert main(["status", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ") and needle in err


def test_status_all_one_line_per_host(run, local_host, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(local_host.hosts_file.read_text()
                     + '\n[hosts.gone]\ntransport = "ssh"\naddress = "127.0.0.1"\nport = 1\n')
    code, [doc] = status_json(capsys, "--all", "--hosts", str(hosts))
    by_host = {h["host"]: h for h in doc["hosts"]}
    assert by_host["local"]["verdict"] == "training"
    assert by_host["gone"]["exit_code"] == 102 and by_host["gone"]["error"]
    assert code == 102
    capsys.readouterr()
    main(["status", "--all", "--hosts", str(hosts)])
    out = capsys.readouterr().out
    assert "local" in out and "training" in out and "gone" in out and "unreachable" in out


def _kill_watch_probes(workspace: Path) -> int:
    """SIGKILL the streaming probes watching `workspace`: the connection drops, the watch must reconnect.

    Counts the probes, not their forks: a probe's child between fork and exec (its nvidia-smi each tick) still shows
    the probe's command line, so a match whose parent also matched is that child, killed but not counted.
    """
    parents: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            ppid = int((p / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"--watch" in argv and str(workspace).encode() in argv:
            parents[int(p.name)] = ppid
    for pid in parents:
        with contextlib.suppress(ProcessLookupError):  # a fork that has exec'd and ended since
            os.kill(pid, signal.SIGKILL)
    return sum(1 for ppid in parents.values() if ppid not in parents)


def test_watch_reconnect_rereads_a_log_rotated_while_disconnected(run, local_host) -> None:  # noqa: ANN001
    run_dir, _ = run
    crash = subprocess.run(  # a real thread traceback, as the new log file's first lines
        [sys.executable, "-c", "import threading\ndef f():\n    raise RuntimeError('after the rotation')\n"
         "t = threading.Thread(target=f, name='drafter-7'); t.start(); t.join()"], capture_output=True, timeout=30)
    assert b"Exception in thread drafter-7" in crash.stderr
    views = status_cmd.watch(lambda: connect(local_host.host), interval=0.2, sleep=lambda s: None)
    try:
        next(views)  # the first look
        assert next(views).reconnecting is None  # the streaming probe is running
        assert _kill_watch_probes(local_host.workspace_dir) == 1
        os.rename(run_dir / "train.log", run_dir / "train.log.1")  # rotated while disconnected ...
        (run_dir / "train.log").write_bytes(crash.stderr + b"step=1 loss=9.0\n" * 5000)  # ... longer than before
        dropped = False
        for i, v in enumerate(views):
            dropped = dropped or v.reconnecting is not None
            if dropped and v.reconnecting is None:  # the first report after reconnecting
                break
            assert i < 50
    finally:
        views.close()
    assert [(t.name, t.exception) for t in v.health.threads] == [("drafter-7", "RuntimeError")]
    assert v.health.verdict == Verdict.DEGRADED
