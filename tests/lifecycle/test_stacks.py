"""`dflashctl stacks` on real processes: the real trainer (torch on the CPU) on the local host and through ssh +
`pct exec`, by its dump signal (no py-spy) and, where a py-spy binary can be had offline, by py-spy; a program
that is not our trainer (exit 2, one line, never signalled); the sentinel's capture(), bounded in time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.pyspy import py_spy_binary, without_py_spy

from dflashctl.agent.stacks import capture

from .conftest import alive, kill_quietly, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
FAST = ["--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set", "train.seq_len=64",
        "--set", "train.log_interval=1", "--set", "runtime.heartbeat_interval_s=0.2", "--set", "train.steps=100000"]
TRAINER_THREADS = {"MainThread", "coordinator", "drafter-0", "drafter-1", "drafter-2"}  # tiny-cpu.toml: 3 drafters
THREADED = '''\
import os, sys, threading, time
sys.path.insert(0, os.environ["TRAINER_ROOT"]) if os.environ.get("TRAINER_ROOT") else None
if os.environ.get("TRAINER_ROOT"):
    from pathlib import Path
    from trainer import threaddump
    threaddump.install(Path(os.environ["DFLASH_RUN_DIR"]))
def work(n):
    while True:
        time.sleep(0.05)
for i in range(2):
    threading.Thread(target=work, args=(i,), name=f"worker-{i}", daemon=True).start()
if os.environ.get("TRAINER_ROOT"):
    threaddump.note_threads()
print("ready", flush=True)
while True:
    time.sleep(0.1)
'''


@pytest.fixture(scope="session")
def py_spy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path | None, str]:
    return py_spy_binary(tmp_path_factory.mktemp("py-spy"))


def check_trainer_stacks(doc: dict, pid: int, method: str) -> None:
    """Every drafter thread and the coordinator (and the main thread) with a current frame and its code."""
    program = doc["processes"][0]
    assert (program["pid"], program["role"], program["method"]) == (pid, "program", method), program
    threads = {t["thread"]: t for t in program["threads"]}
    assert threads.keys() >= TRAINER_THREADS, sorted(threads)
    for name in TRAINER_THREADS:
        t = threads[name]
        assert t["pid"] == pid and isinstance(t["native_id"], int) and t["frames"], t
        assert t["frames"][0]["line"] and t["frames"][0]["file"], t
        ours = [f for f in t["frames"] if "trainer/" in f["file"]]
        assert all(f["code"] for f in ours), t  # the line of code, read in the container
    # a thread deep in torch (backward, an optimizer step) may show only torch's frames: faulthandler keeps the
    # innermost 100; most drafters and the coordinator are at their own loop
    drafters = [threads[n]["frames"] for n in TRAINER_THREADS if n.startswith("drafter-")]
    assert any(any(f["function"] == "_drafter" for f in frames) for frames in drafters)
    assert any(f["function"] == "_coordinator" for f in threads["coordinator"]["frames"])


def test_stacks_of_the_real_trainer_on_the_local_host(local_host, cli, py_spy, monkeypatch) -> None:
    monkeypatch.setenv("PATH", without_py_spy(os.environ["PATH"]))
    launched = cli("launch", "--name", "stk", "--wait-for", "step", "--timeout", "240", "--json", "--", *FAST)
    assert launched.code == 0, launched.err
    pid, rd = launched.json()["pid"], Path(launched.json()["run_dir"])

    got = cli("stacks", "--json")
    assert got.code == 0, got.err
    doc = got.json()
    assert doc["run"] == rd.name and doc["py_spy"] is None
    check_trainer_stacks(doc, pid, "faulthandler")
    assert "supervisor" in {s["role"] for s in doc["skipped"]}
    saved = json.loads(Path(doc["saved"]).read_text())
    assert saved["reason"] == "dflashctl stacks" and saved["processes"][0]["method"] == "faulthandler"
    assert "most recent call first" in saved["processes"][0]["raw"]
    assert "most recent call first" not in (rd / "train.log").read_text()  # the dump never goes to the log

    text = cli("stacks", "--no-save")
    assert text.code == 0, text.err
    assert re.search(rf"^pid {pid} · drafter-1 \(native \d+\)", text.out, re.M), text.out
    assert re.search(r"^    _drafter \(trainer/pipeline\.py:\d+\)\n        \S", text.out, re.M), text.out
    assert "saved" not in text.out
    assert len(list((rd / "stacks").glob("capture-*.json"))) == 1  # --no-save kept none

    with_all = cli("stacks", "--all", "--json", "--no-save").json()
    supervisor = next(p for p in with_all["processes"] if p["role"] == "supervisor")
    assert supervisor["threads"] == [] and "py-spy is not installed" in supervisor["error"]
    assert alive(pid) and alive(supervisor["pid"])  # neither was signalled to death

    binary, _ = py_spy  # where none can be had offline, test_a_program_…_with_py_spy says so
    if binary is not None:
        monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ['PATH']}")
        spied = cli("stacks", "--json", "--no-save")
        assert spied.code == 0, spied.err
        assert spied.json()["py_spy"] == str(binary)
        check_trainer_stacks(spied.json(), pid, "py-spy")
        states = {t["state"] for t in spied.json()["processes"][0]["threads"]}
        assert states <= {"idle", "active", "active+gil", "gil"}
    assert cli("stop").code == 103
    ended = cli("stacks")
    assert ended.code == 2 and "has no live process" in ended.err


def set_container_path(pve, extra_dir: Path | None) -> None:
    """The container's PATH (its lxc.environment), with extra_dir first; None: without any py-spy."""
    path = without_py_spy(pve.environment("PATH") or "")
    pve.set_environment("PATH", f"{extra_dir}:{path}" if extra_dir else path)


def test_stacks_of_the_real_trainer_through_ssh_and_pct(pve, cli, py_spy) -> None:
    set_container_path(pve, None)
    launched = cli("launch", "--name", "stk-ct", "--wait-for", "step", "--timeout", "300", "--json", "--", *FAST)
    assert launched.code == 0, launched.err
    pid, run_id = launched.json()["pid"], launched.json()["run_id"]
    got = cli("stacks", "--json")
    assert got.code == 0, got.err
    doc = got.json()
    assert doc["run_dir"] == f"/workspace/dflash/runs/{run_id}" and doc["host"] == "pve"
    check_trainer_stacks(doc, pid, "faulthandler")
    assert all(f["file"].startswith("/workspace/dflash/.code/") for t in doc["processes"][0]["threads"]
               for f in t["frames"] if "trainer/" in f["file"])  # the container's paths, its pids
    local_run = pve.workspace_dir / "dflash" / "runs" / run_id
    assert Path(doc["saved"]).name in {p.name for p in (local_run / "stacks").glob("capture-*.json")}

    binary, _ = py_spy
    if binary is not None:
        set_container_path(pve, binary.parent)
        spied = cli("stacks", "--json", "--no-save")
        assert spied.code == 0, spied.err
        check_trainer_stacks(spied.json(), pid, "py-spy")
        assert spied.json()["py_spy_version"].startswith("py-spy ")
    assert cli("stop").code == 103


def launch_threaded(cli, tmp_path: Path) -> tuple[int, Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "prog.py").write_text(THREADED)
    launched = cli("launch", "--source", str(src), "--name", "mine", "--json", "--exec", "--", "python3", "prog.py")
    assert launched.code == 0, launched.err
    pid, rd = launched.json()["pid"], Path(launched.json()["run_dir"])
    wait_until(lambda: "ready" in (rd / "train.log").read_text(), timeout=30, what="the program's threads")
    return pid, rd


def test_a_program_that_is_not_our_trainer_and_no_py_spy_is_exit_2_in_one_line(local_host, cli, tmp_path,
                                                                                 monkeypatch) -> None:
    monkeypatch.setenv("PATH", without_py_spy(os.environ["PATH"]))
    pid, rd = launch_threaded(cli, tmp_path)

    res = cli("stacks")
    assert res.code == 2, (res.out, res.err)
    lines = res.err.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["ERROR", "HINT"], res.err
    assert lines[0].startswith(f"ERROR: no stacks for run {rd.name}: py-spy is not installed in the container and "
                               f"pid {pid} (python3 prog.py) registered no dump signal")
    assert "pip install py-spy" in lines[1] and "kernel.yama.ptrace_scope" in lines[1]
    assert res.out == "" and alive(pid)  # never sent a signal whose default action would have ended it
    assert not (rd / "stacks").exists()
    assert cli("stop").code == 103


def test_a_program_that_is_not_our_trainer_with_py_spy(local_host, cli, py_spy, tmp_path, monkeypatch) -> None:
    binary, why = py_spy
    if binary is None:
        if os.environ.get("DFLASHCTL_REQUIRE_PYSPY") == "1":  # make test: a missing py-spy is a failure, not a skip
            pytest.fail(f"no py-spy to test with: {why}")
        pytest.skip(f"no py-spy to test with: {why}")
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{without_py_spy(os.environ['PATH'])}")
    pid, _ = launch_threaded(cli, tmp_path)
    spied = cli("stacks")
    assert spied.code == 0, spied.err
    # py-spy's state is its sample's instant: a thread just woken from its sleep reads "active" (seen on CI)
    assert re.search(rf"^pid {pid} · worker-1 \(native \d+\) · (idle|active|active\+gil|gil)\n"
                     r"    work \(.*prog\.py:9\)\n        time\.sleep\(0\.05\)$", spied.out, re.M), spied.out
    assert cli("stop").code == 103


def start_threaded(run_dir: Path, run_id: str, *, dump_signal: bool) -> subprocess.Popen:
    run_dir.mkdir(parents=True)
    env = {**os.environ, "DFLASH_RUN_ID": run_id, "DFLASH_RUN_DIR": str(run_dir),
           **({"TRAINER_ROOT": str(REPO)} if dump_signal else {})}
    prog = run_dir.parent / f"{run_id}.py"
    prog.write_text(THREADED)
    proc = subprocess.Popen([sys.executable, str(prog)], env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    (run_dir / "pid").write_text(f"{proc.pid}\n")
    return proc


def test_capture_saves_the_raw_dumps_and_returns_a_summary(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", without_py_spy(os.environ["PATH"]))
    rd = tmp_path / "runs" / "cap"
    proc = start_threaded(rd, "cap", dump_signal=True)
    try:
        summary = capture(str(rd), "cap", "stalled: no step for 10m")
        assert summary["reason"] == "stalled: no step for 10m" and summary["dumped"] == 1
        assert summary["processes"] == [{"pid": proc.pid, "role": "program", "method": "faulthandler", "threads": 3,
                                         "error": None}]
        doc = json.loads(Path(summary["path"]).read_text())
        assert Path(summary["path"]).parent == rd / "stacks" and Path(summary["path"]).name.startswith("capture-")
        rec = doc["processes"][0]
        assert (doc["reason"], doc["run_id"], rec["method"], rec["format"]) == (
            "stalled: no step for 10m", "cap", "faulthandler", "faulthandler")
        assert {v["name"] for v in rec["threads"].values()} == {"MainThread", "worker-0", "worker-1"}
        assert any(code == "time.sleep(0.05)" for code in rec["code"].values())

        os.kill(proc.pid, signal.SIGSTOP)  # a stopped process cannot run its handler: bounded, one reason
        t0 = time.monotonic()
        stopped = capture(str(rd), "cap", "stopped")
        assert time.monotonic() - t0 < 8
        assert stopped["dumped"] == 0 and "no dump within 5 s of SIGUSR1 (process state T)" in \
            stopped["processes"][0]["error"]
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.poll() is None
    finally:
        kill_quietly(proc.pid)
        proc.wait(timeout=10)


def test_capture_of_a_process_without_py_spy_or_dump_signal_names_what_is_missing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", without_py_spy(os.environ["PATH"]))
    rd = tmp_path / "runs" / "plain"
    proc = start_threaded(rd, "plain", dump_signal=False)
    try:
        summary = capture(str(rd), "plain", "stall")
        assert summary["dumped"] == 0 and summary["py_spy"] is None
        assert "py-spy is not installed" in summary["processes"][0]["error"]
        assert proc.poll() is None
    finally:
        kill_quietly(proc.pid)
        proc.wait(timeout=10)


def test_stacks_of_an_unknown_run_is_102(local_host, cli) -> None:
    res = cli("stacks", "no-such-run")
    assert res.code == 102 and "no-such-run" in res.err


DENIED = '''#!/bin/sh
# py-spy where ptrace is refused (its own message, printed on stderr, exit 1)
case "$1" in --version) echo "py-spy 0.4.2"; exit 0;; esac
printf '%s\n' "Error: Permission Denied: Try running again with elevated permissions by going \
'sudo env \\"PATH=\\$PATH\\" !!'" >&2
exit 1
'''


def refusing_py_spy(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "denied-bin"
    bin_dir.mkdir()
    (bin_dir / "py-spy").write_text(DENIED)
    (bin_dir / "py-spy").chmod(0o755)
    return bin_dir


def test_a_refused_py_spy_falls_back_to_the_dump_signal_and_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{refusing_py_spy(tmp_path)}{os.pathsep}{without_py_spy(os.environ['PATH'])}")
    rd = tmp_path / "runs" / "denied"
    proc = start_threaded(rd, "denied", dump_signal=True)
    try:
        summary = capture(str(rd), "denied", "stall")
        assert summary["processes"][0]["method"] == "faulthandler" and summary["processes"][0]["threads"] == 3
        notes = json.loads(Path(summary["path"]).read_text())["processes"][0]["notes"]
        assert notes == ["py-spy: Permission Denied: Try running again with elevated permissions by going "
                         "'sudo env \"PATH=$PATH\" !!'; py-spy --nonblocking: Permission Denied: Try running again "
                         "with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'"]
    finally:
        kill_quietly(proc.pid)
        proc.wait(timeout=10)


def test_a_refused_py_spy_and_no_dump_signal_is_exit_2_with_the_ptrace_hint(local_host, cli, tmp_path,
                                                                             monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{refusing_py_spy(tmp_path)}{os.pathsep}{without_py_spy(os.environ['PATH'])}")
    pid, rd = launch_threaded(cli, tmp_path)
    res = cli("stacks")
    assert res.code == 2, (res.out, res.err)
    error, hint = res.err.splitlines()
    assert error.startswith(f"ERROR: no stacks for run {rd.name}: py-spy failed for pid {pid} (python3 prog.py): "
                            "py-spy: Permission Denied")
    assert "kernel.yama.ptrace_scope" in hint and alive(pid)
    assert cli("stop").code == 103


# a program that says it runs (so /proc/<pid>/cmdline is its own, not the exec in flight), then waits for stdin
READY_THEN_WAIT = "import sys\nprint(\"up\", flush=True)\nsys.stdin.read()\n"


@pytest.mark.parametrize("shape", ["agent.pyz", "sentinel.pyz"])
def test_a_runs_sentinel_is_recognised_in_both_shapes_of_its_command_line(tmp_path: Path, shape: str) -> None:
    """A run started before the agent archive runs `python3 <run>/sentinel.pyz <run>`; one after, `python3
    <run>/agent.pyz sentinel <run>`: stacks names either the sentinel, read from the live process's /proc cmdline."""
    import zipfile

    from dflashctl.agent.stacks import _role

    program = tmp_path / shape
    with zipfile.ZipFile(program, "w") as z:
        z.writestr("__main__.py", READY_THEN_WAIT)
    args = [str(program), "sentinel", str(tmp_path)] if shape == "agent.pyz" else [str(program), str(tmp_path)]
    proc = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"  # running its program: its cmdline is whole
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        assert argv[1:] == args
        assert _role(proc.pid, argv, None, None) == "sentinel"
        assert _role(proc.pid, [sys.executable, str(tmp_path / "train.py")], None, None) == "child"
    finally:
        proc.communicate(b"")


def test_a_frame_of_a_pruned_install_is_read_from_the_processs_own_archive(tmp_path: Path) -> None:
    """Bytecode names the install it was compiled in (`<ws>/.agent/<sha>.pyz/…`); a run's supervisor and sentinel
    run `<run>/agent.pyz`, the same bytes. After an install prunes that archive, the frame's line still reads."""
    import zipfile

    from dflashctl.agent.lib.pystacks import code_lines

    run = tmp_path / "run"
    run.mkdir()
    with zipfile.ZipFile(run / "agent.pyz", "w") as z:
        z.writestr("__main__.py", READY_THEN_WAIT)
        z.writestr("dflashctl/agent/mod.py", "x = 1\nwaiting_here = True\n")
    pruned = tmp_path / ".agent" / f"{'a' * 64}.pyz"  # never there: pruned
    proc = subprocess.Popen([sys.executable, str(run / "agent.pyz")], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"
        lines = code_lines(proc.pid, [(f"{pruned}/dflashctl/agent/mod.py", 2), (f"{pruned}/dflashctl/nope.py", 1)])
        assert lines == {f"{pruned}/dflashctl/agent/mod.py:2": "waiting_here = True"}
    finally:
        proc.communicate(b"")
