"""The run's sentinel end to end through the loopback sshd + `pct` stand-in, with no dflashctl process connected:
a crashed drafter of the real trainer reaches a webhook; GPUs idling with memory held past the idle limit get the
run stopped; a program that crashes twice then succeeds becomes three linked, resumed attempts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.poll import wait_until

from dflashctl.cli import main

from .receiver import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

FAST = ["--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set", "train.seq_len=64",
        "--set", "train.log_interval=1", "--set", "runtime.heartbeat_interval_s=0.2"]
FLAKY = '''\
import json, os, sys, time
run, prev = os.environ["DFLASH_RUN_DIR"], os.environ.get("DFLASH_RESUME_FROM")
step = 0
if prev and os.path.exists(os.path.join(prev, "ckpt.json")):
    with open(os.path.join(prev, "ckpt.json")) as f:
        step = json.load(f)["step"]
    print(f"resumed from {prev} at step {step}", flush=True)
for _ in range(3):
    step += 1
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    with open(os.path.join(run, "ckpt.json"), "w") as f:
        json.dump({"step": step}, f)
    time.sleep(0.1)
if step < 9:
    raise SystemExit(f"crash at step {step}")
print("done", flush=True)
'''
STEPS = '''\
import time
step = 0
while True:
    step += 1
    print(f"step {step} loss 0.5", flush=True)
    time.sleep(0.2)
'''


def dflashctl(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI as its own process, which exits: nobody on the laptop side stays connected."""
    return subprocess.run([sys.executable, "-m", "dflashctl", *argv], env=os.environ, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def deploy(tmp_path: Path, name: str, text: str) -> None:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / name).write_text(text)
    done = dflashctl("deploy", "--source", str(src))
    assert done.returncode == 0, done.stderr


@pytest.mark.both_env_modes
def test_a_crashed_drafter_reaches_a_webhook_once_with_thread_exception_and_remedy(pve, capsys) -> None:  # noqa: ANN001
    with Receiver("ok") as rx:
        done = dflashctl("launch", "--name", "sentinel-a", "--notify", rx.url(), "--json", "--env",
                         "DFLASH_FAULT=drafter-1@3:oom", "--", *FAST, "--set", "train.steps=100000",
                         "--set", "runtime.on_worker_failure=continue")
        assert done.returncode == 0, done.stderr
        run_dir = pve.workspace_dir / "dflash" / "runs" / json.loads(done.stdout)["run_id"]
        crashes = rx.wait_for(lambda ms: [m for m in ms if m["kind"] == "worker-crashed"], timeout=240,
                              what="the drafter's crash")
        msg = crashes[0]
        assert (msg["host"], msg["run"], msg["worker"]) == ("pve", run_dir.name, "drafter-1")
        assert msg["exception"] == "torch.OutOfMemoryError" and msg["verdict"] == "degraded"
        assert msg["signature"]["id"] == "cuda-oom" and msg["remedy"] == msg["signature"]["remedy"] != ""
        assert msg["command"] == f"dflashctl status --host pve {run_dir.name}"
        # the run trains on without drafter-1; more steps, and still the one crash message
        crashed_at = json.loads((run_dir / "heartbeat.json").read_text())["step"]
        wait_until(lambda: json.loads((run_dir / "heartbeat.json").read_text()).get("step", 0) >= crashed_at + 10,
                   timeout=120, what="ten more steps after the crash")
        assert [m["worker"] for m in rx.messages() if m["kind"] == "worker-crashed"] == ["drafter-1"]
        assert [e["worker"] for e in events(run_dir) if e["kind"] == "worker-crashed"] == ["drafter-1"]
        code, status = cli_json(capsys, "status", "--json")
        assert code == 105 and any(e["kind"] == "worker-crashed" for e in status["events"])
        assert main(["stop"]) == 103
        ended = rx.wait_for(lambda ms: [m for m in ms if m["kind"] == "ended"], what="the end")
        assert ended[0]["verdict"] == "stopped"
    assert [e["kind"] for e in events(run_dir)][-1] == "ended"
    assert (run_dir / "exit_code").read_text().strip() == "143"


def test_gpus_idle_with_memory_held_past_the_idle_limit_get_the_run_stopped_and_say_why(pve, tmp_path,  # noqa: ANN001
                                                                                        capsys) -> None:
    pve.set_gpus([{"memory.used": 70000, "utilization.gpu": 0}, {"memory.used": 71000, "utilization.gpu": 1}])
    deploy(tmp_path, "steps.py", STEPS)
    with Receiver("ok") as rx:
        done = dflashctl("launch", "--exec", "--name", "idle", "--idle-limit", "5%@3s", "--notify", rx.url(),
                         "--json", "--", "python3", "steps.py")
        assert done.returncode == 0, done.stderr
        run_dir = pve.workspace_dir / "dflash" / "runs" / json.loads(done.stdout)["run_id"]
        policy = rx.wait_for(lambda ms: [m for m in ms if m["kind"] == "policy"], timeout=120, what="the stop")
        assert "GPUs 0-1 below 5 % utilisation with memory held" in policy[0]["message"]
        assert "idle limit 5%@3s" in policy[0]["message"]
        wait_until(lambda: (run_dir / "exit_code").exists(), timeout=90, what="the run's exit code")
    stopped = json.loads((run_dir / "stopped").read_text())
    assert (stopped["by"], stopped["reason"]) == ("sentinel", "idle")
    code, status = cli_json(capsys, "status", "--json")
    assert code == 103 and status["verdict"] == "stopped"
    assert status["reasons"][0].startswith("stopped by the failure policy: GPUs 0-1 below 5 %")
    kinds = [e["kind"] for e in events(run_dir)]
    assert kinds.count("policy") == 1 and kinds[-1] == "ended"


def test_a_program_that_crashes_twice_then_succeeds_is_three_linked_resumed_attempts(pve, tmp_path,  # noqa: ANN001
                                                                                     capsys) -> None:
    deploy(tmp_path, "flaky.py", FLAKY)
    done = dflashctl("launch", "--exec", "--name", "flaky", "--restart-on", "crashed", "--max-restarts", "2",
                     "--backoff", "1s", "--wait-for", "exit", "--json", "--", "python3", "flaky.py")
    assert done.returncode == 0, done.stderr
    runs_dir = pve.workspace_dir / "dflash" / "runs"
    code, listing = cli_json(capsys, "runs", "--json")
    chain = sorted((r for r in listing["runs"] if r["name"] == "flaky"), key=lambda r: r["attempt"])
    assert [(r["attempt"], r["verdict"], r["exit_code"]) for r in chain] == [
        (1, "crashed", 1), (2, "crashed", 1), (3, "finished", 0)]
    assert len({r["id"] for r in chain}) == 3 and os.readlink(runs_dir / "latest") == chain[2]["id"]
    for before, after in zip(chain, chain[1:], strict=False):
        assert after["restart_of"] == before["id"] and after["chain"]["first"] == chain[0]["id"]
        resumed = f"resumed from /workspace/dflash/runs/{before['id']} at step {3 * before['attempt']}"
        assert resumed in (runs_dir / after["id"] / "train.log").read_text()
        restarts = [e for e in events(runs_dir / before["id"]) if e["kind"] == "restart"]
        assert [(e["attempt"], e["next_run"]) for e in restarts] == [(after["attempt"], after["id"])]
    assert "done" in (runs_dir / chain[2]["id"] / "train.log").read_text()
    assert not (runs_dir / chain[2]["id"] / "restart.json").exists()
