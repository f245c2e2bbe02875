"""Start a run detached inside the container, and supervise it (stdlib only; runs there, not here).

Two modes, one file:

* launch (the client sends this source on stdin with a SPEC appended): creates the run
  directory exclusively, config.toml, meta.json and train.log (before anything starts), points
  runs/latest at it, then forks a supervisor in a new session with stdin /dev/null, stdout and
  stderr on train.log and every other fd closed, so `pct exec` / ssh return at once. It prints one
  framed line `DFLASH-RESULT <json>` (run id, dir, pid) and exits.
* supervise (`python3 <run-dir>/launcher.py supervise <run-dir>`, exec'd with DFLASH_RUN_ID in its
  environment): writes its own pid to `supervisor.pid`, starts the trainer as the leader of its
  own process group, writes `pid`, forwards SIGTERM to the group, waits, cleans up leftovers of the
  group and writes `exit_code` atomically, so a crash is recorded though nobody is attached.
  Readers count the run alive until `exit_code` while the supervisor lives, so the seconds spent
  reaping leftovers never look like a lost run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

FRAME = "DFLASH-RESULT "
MARKER = "DFLASH_RUN_ID"
GROUP_GRACE_S = 5.0
KILL_WAIT_S = 5.0


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _emit(doc: dict) -> int:
    sys.stdout.write(FRAME + json.dumps(doc) + "\n")
    sys.stdout.flush()
    return 0 if "error" not in doc else 1


def _mkdir_exclusive(runs_dir: str, base_id: str) -> tuple[str, str]:
    """A fresh directory: never reuse one; a collision gets -2, -3 ... appended."""
    os.makedirs(runs_dir, exist_ok=True)
    for i in range(1, 100):
        run_id = base_id if i == 1 else f"{base_id}-{i}"
        path = os.path.join(runs_dir, run_id)
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return run_id, path
    raise RuntimeError(f"no free run directory for {base_id} in {runs_dir}")


def launch(spec: dict, source: str) -> int:
    cwd = spec["cwd"]
    config_src = None
    if spec.get("config_text") is None:
        path = spec["config_path"]
        config_src = path if os.path.isabs(path) else os.path.join(cwd, path)
        if not os.path.isfile(config_src):
            return _emit({"error": "config-missing", "message": f"config {config_src} not found in the container"})
    os.makedirs(spec["runs_dir"], exist_ok=True)
    lock = os.open(os.path.join(os.path.dirname(spec["runs_dir"].rstrip("/")), ".launch.lock"),
                   os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # held until we exit: two launches at once cannot both pass this point
    live = _live_latest(spec["runs_dir"])
    if live:
        return _emit({"error": "run-alive", "message": f"run {live} is still running", "run_id": live})
    resume = spec.get("resume_from")
    checkpoint = None
    if resume:
        if "/" in resume or resume in (".", "..", "latest"):
            return _emit({"error": "no-checkpoint", "message": f"{resume!r} is not a run id"})
        checkpoint = _newest_checkpoint(os.path.join(spec["runs_dir"], resume))
        if checkpoint is None:
            return _emit({"error": "no-checkpoint", "message": f"run {resume} has no checkpoint to resume from"})
    try:
        run_id, run_dir = _mkdir_exclusive(spec["runs_dir"], spec["base_id"])
    except (OSError, RuntimeError) as e:
        return _emit({"error": "run-dir", "message": str(e)})
    resumed = _take_checkpoint(checkpoint, run_dir, resume) if resume and checkpoint else None
    config = os.path.join(run_dir, "config.toml")
    if config_src is None:
        _write_atomic(config, spec["config_text"].encode("utf-8"))
    else:
        with open(config_src, "rb") as f:
            _write_atomic(config, f.read())
    argv = [spec["python"], "-m", spec["module"], "--config", config, "--run-dir", run_dir, *spec["extra"]]
    meta = dict(spec["meta"])
    meta.update({
        "id": run_id,
        "run_dir": run_dir,
        "argv": argv,
        "cwd": os.path.realpath(cwd),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "started_at_epoch": time.time(),
    })
    meta["config"] = dict(meta.get("config") or {}, path=config, copied_from=config_src)
    if resumed:
        meta["resumed_from"] = resumed
    _write_atomic(os.path.join(run_dir, "meta.json"), (json.dumps(meta, indent=2) + "\n").encode())
    _write_atomic(os.path.join(run_dir, "launch.json"),
                  json.dumps({"argv": argv, "cwd": cwd, "env": spec.get("env") or {}}).encode())
    _write_atomic(os.path.join(run_dir, "launcher.py"), source.encode())
    log_fd = os.open(os.path.join(run_dir, "train.log"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    tmp_link = os.path.join(spec["runs_dir"], f".latest-{os.getpid()}")
    os.symlink(run_id, tmp_link)
    os.replace(tmp_link, os.path.join(spec["runs_dir"], "latest"))

    env = dict(os.environ)
    env.update(spec.get("env") or {})
    env[MARKER] = run_id
    sys.stdout.flush()
    child = os.fork()
    if child == 0:  # the supervisor-to-be: detach completely, then exec with the marker in its environ
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            _close_other_fds()
            script = os.path.join(run_dir, "launcher.py")
            os.execve(sys.executable, [sys.executable, script, "supervise", run_dir], env)
        except BaseException as e:  # noqa: BLE001 - nothing may escape a forked child
            os.write(2, f"[dflashctl] could not start the supervisor: {e}\n".encode())
            _write_atomic(os.path.join(run_dir, "exit_code"), b"127\n")
        os._exit(127)
    os.close(log_fd)
    pid, exit_code = _wait_for_pid(run_dir, child, timeout=5.0)
    return _emit({"run_id": run_id, "run_dir": run_dir, "pid": pid, "exit_code": exit_code, "supervisor": child,
                  "resumed_from": resumed})


_CHECKPOINT = re.compile(r"^step-(\d{8})\.pt$")  # trainer/checkpoint.py's names: temp files never match


def _newest_checkpoint(run_dir: str) -> str | None:
    try:
        names = [n for n in os.listdir(os.path.join(run_dir, "checkpoints")) if _CHECKPOINT.match(n)]
    except OSError:
        return None
    return os.path.join(run_dir, "checkpoints", max(names)) if names else None


def _take_checkpoint(checkpoint: str, run_dir: str, source_run: str) -> dict:
    """The new run starts with the source run's newest checkpoint in its own checkpoints/: a hard link (no copy
    of gigabytes; safe because checkpoints are written by rename and never changed in place, and each run's pruning
    only unlinks its own names), a copy where a link is impossible. The source run directory is not touched."""
    dest_dir = os.path.join(run_dir, "checkpoints")
    os.mkdir(dest_dir)
    dest = os.path.join(dest_dir, os.path.basename(checkpoint))
    try:
        os.link(checkpoint, dest)
        linked = True
    except OSError:
        shutil.copyfile(checkpoint, dest + ".tmp")
        os.replace(dest + ".tmp", dest)
        linked = False
    step = int(_CHECKPOINT.match(os.path.basename(checkpoint)).group(1))
    return {"run": source_run, "checkpoint": checkpoint, "step": step, "linked": linked}


def _wait_for_pid(run_dir: str, child: int, timeout: float) -> tuple[int | None, int | None]:
    """The trainer's pid as the supervisor records it (or the exit code if it could not start)."""
    deadline = time.time() + timeout
    while True:
        pid = _read_int(os.path.join(run_dir, "pid"))
        code = _read_int(os.path.join(run_dir, "exit_code"))
        if pid is not None or code is not None or time.time() > deadline:
            return pid, code
        with contextlib.suppress(ChildProcessError):  # our child until we exit: reap it if it died early
            os.waitpid(child, os.WNOHANG)
        time.sleep(0.05)


def _live_latest(runs_dir: str) -> str | None:
    """The latest run's id while it is alive, by the probe's rule (pieces/runstate.py `liveness`): its
    recorded pid lives and carries its marker; or, until its exit code is recorded, its supervisor or
    a marked process of the trainer's group still does (it is ending: leftovers being reaped)."""
    try:
        run_id = os.path.basename(os.readlink(os.path.join(runs_dir, "latest")))
    except OSError:
        return None
    run_dir = os.path.join(runs_dir, run_id)
    pid = _read_int(os.path.join(run_dir, "pid"))
    if _ours(pid, run_id):
        return run_id
    if _read_int(os.path.join(run_dir, "exit_code")) is not None:
        return None
    if _ours(_read_int(os.path.join(run_dir, "supervisor.pid")), run_id) or _group_marked(pid, run_id):
        return run_id
    return None


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...]."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _ours(pid: int | None, run_id: str) -> bool:
    """pid is alive (not defunct) and carries run_id's marker (a reused pid carries another)."""
    if not pid:
        return False
    fields = _stat_fields(pid)
    if not fields or fields[0] in (b"Z", b"X"):
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"{MARKER}={run_id}".encode() in env


def _group_marked(pgid: int | None, run_id: str) -> bool:
    """Some live process of group pgid carries run_id's marker."""
    if not pgid:
        return False
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields and len(fields) > 2 and fields[2] == str(pgid).encode() and _ours(int(name), run_id):
                return True
    return False


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _close_other_fds() -> None:
    """Close every fd above 2 (the ssh / pct exec pipes among them), so nothing holds the caller."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 65536))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.close(fd)


def supervise(run_dir: str) -> int:
    with open(os.path.join(run_dir, "launch.json")) as f:
        spec = json.load(f)
    exit_path = os.path.join(run_dir, "exit_code")
    with contextlib.suppress(OSError):  # only a liveness hint: never a reason to leave no exit_code
        _write_atomic(os.path.join(run_dir, "supervisor.pid"), f"{os.getpid()}\n".encode())
    try:
        proc = subprocess.Popen(spec["argv"], cwd=spec["cwd"], stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        sys.stderr.write(f"[dflashctl] cannot start {spec['argv'][0]!r} in {spec['cwd']}: {e}\n")
        sys.stderr.flush()
        _write_atomic(exit_path, b"127\n")
        return 127
    _write_atomic(os.path.join(run_dir, "pid"), f"{proc.pid}\n".encode())

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    rc = proc.wait()
    code = rc if rc >= 0 else 128 - rc
    leftovers = _reap_group(proc.pid)
    note = f"; stopped {leftovers} leftover process(es) of its group" if leftovers else ""
    sys.stderr.write(f"[dflashctl] trainer exited with code {code}{note}\n")
    sys.stderr.flush()
    _write_atomic(exit_path, f"{code}\n".encode())
    return 0


def _reap_group(pgid: int) -> int:
    """After the leader exits, nothing of the run may linger: SIGTERM the group, grace, SIGKILL, and
    wait until no member is left alive (a signal is delivered after kill() returns), so that
    `exit_code` present means the whole group is gone. Defunct members count as gone."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        return 0
    deadline = time.time() + GROUP_GRACE_S
    while time.time() < deadline:
        if not _group_live(pgid):
            return 1
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    end = time.time() + KILL_WAIT_S  # only a process stuck in the kernel (state D) outlives this
    while _group_live(pgid) and time.time() < end:
        time.sleep(0.02)
    return 1


def _group_live(pgid: int) -> bool:
    """Some process of group pgid is alive (not defunct)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields and len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
                return True
    return False


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "supervise":
    sys.exit(supervise(sys.argv[2]))
