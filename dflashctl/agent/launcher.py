"""Start a run detached inside the container, supervise it, or adopt one started by hand (stdlib only; runs
there, not here).

Three modes, one file:

* launch (`python3 <archive> launch`, the SPEC on stdin; agent/verbs.py): creates the run
  directory exclusively, config.toml (the bundled trainer only), meta.json and train.log (before
  anything starts), points runs/latest at it, then forks a supervisor in a new session with stdin
  /dev/null, stdout and stderr on train.log and every other fd closed, so `pct exec` / ssh return at
  once. It prints its one reply line (lib/frame.py: run id, dir, pid) and exits. The program is
  `python -m trainer --config … --run-dir …` (the bundled trainer), or any argv (`launch --exec`), or
  `bash -c CMD` (`launch --shell`), started in <workspace>/code with the run's own variables
  (DFLASH_RUN_ID, DFLASH_RUN_DIR, PYTHONUNBUFFERED=1 and the user's --env).
* supervise (`python3 <run-dir>/agent.pyz supervise <run-dir>`, exec'd with DFLASH_RUN_ID in its
  environment; the launch copies the archive it runs from into the run, so every attempt of a run and its sentinel
  run the code that started it): writes its own pid to `supervisor.pid`, starts the program as the leader of its
  own process group, writes `pid`, forwards SIGTERM to the group, waits, ends what is left of the
  group and every other process carrying the run's marker (torchrun's workers run in sessions of
  their own), and writes `exit_code` atomically, so a crash is recorded though nobody is attached.
  Readers count the run alive until `exit_code` while the supervisor lives, so the seconds spent
  reaping leftovers never look like a lost run.
* adopt: records a run for a process dflashctl did not start: meta.json kind "adopted" with the
  process's identity (pid, start time, boot time, argv, cwd), `pid`, and `train.log` a symlink to the
  log it writes. Under the same lock as launch: never beside a live run.

Whether a run is alive is the one rule (agent/lib/runstate.py `liveness`), imported from the same archive, not a
copy of it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time

from dflashctl.agent.agentinstall import trailer_holds
from dflashctl.agent.lib.attempts import SPEC_FILE, relaunch, wait_before_start
from dflashctl.agent.lib.checkpoints import newest_checkpoint, take_checkpoint
from dflashctl.agent.lib.compilecache import run_cache_env
from dflashctl.agent.lib.diskspace import SPACE_MARGIN, no_space, point_back, readlink
from dflashctl.agent.lib.flightrec_env import recorder_env
from dflashctl.agent.lib.frame import emit
from dflashctl.agent.lib.fsutil import read_int, try_write, write_atomic
from dflashctl.agent.lib.procfs import (
    MARKER,
    RUN_DIR_VAR,
    marked_processes,
    proc_env_var,
    proc_marker,
    proc_stat,
)
from dflashctl.agent.lib.reaping import KILL_WAIT_S, end_group
from dflashctl.agent.lib.rundir import HASH_FILE, lock_runs, mkdir_exclusive, now_iso, point_latest
from dflashctl.agent.lib.runmeta import write_meta
from dflashctl.agent.lib.runstate import live_latest
from dflashctl.agent.lib.sentinelproc import AGENT_FILE, end_sentinel, start_sentinel, unreachable

GROUP_GRACE_S = 5.0


def launch(spec: dict, archive: str) -> int:
    return emit(start(spec, archive))


def start(spec: dict, archive: str, *, wait_pid: bool = True) -> dict:
    """Create the run directory and fork its supervisor; the reply's doc (an {"error"} doc when refused)."""
    cwd = spec["cwd"]
    command, shell = spec.get("command"), spec.get("shell")
    exec_mode = command is not None or shell is not None
    config_src = None
    if exec_mode:
        if not os.path.isdir(cwd):
            return {"error": "code-missing", "message": f"no code deployed in {cwd}"}
    elif spec.get("config_text") is None:
        path = spec["config_path"]
        config_src = path if os.path.isabs(path) else os.path.join(cwd, path)
        if not os.path.isfile(config_src):
            return {"error": "config-missing", "message": f"config {config_src} not found in the container"}
    why = unreachable((spec.get("sentinel") or {}).get("targets") or [])
    if why:
        return {"error": "notify-unreachable", "message": why}
    lock_runs(spec["runs_dir"])
    live = live_latest(spec["runs_dir"])
    if live:
        return {"error": "run-alive", "message": f"run {live} is still running", "run_id": live}
    resume = spec.get("resume_from")
    checkpoint = None
    if resume:
        if "/" in resume or resume in (".", "..", "latest"):
            return {"error": "no-checkpoint", "message": f"{resume!r} is not a run id"}
        checkpoint = newest_checkpoint(os.path.join(spec["runs_dir"], resume))
        if checkpoint is None:
            return {"error": "no-checkpoint", "message": f"run {resume} has no checkpoint to resume from"}
    if spec.get("exact_id") and os.path.lexists(os.path.join(spec["runs_dir"], spec["base_id"])):
        return {"error": "run-dir", "message": f"run {spec['base_id']} already exists in {spec['runs_dir']}"}
    need = os.path.getsize(archive) + len(json.dumps(spec)) + SPACE_MARGIN
    full = no_space(spec["runs_dir"], need)
    if full:
        return {"error": "disk-full", "message": full}
    try:
        run_id, run_dir = mkdir_exclusive(spec["runs_dir"], spec["base_id"])
        os.chmod(run_dir, 0o700)  # launch.json / launch_spec.json hold --env values and notify URLs (issue 26)
    except (OSError, RuntimeError) as e:
        return {"error": "run-dir", "message": str(e)}
    previous = readlink(os.path.join(spec["runs_dir"], "latest"))
    try:
        return _fill_and_start(spec, archive, run_id, run_dir, checkpoint, resume, exec_mode, command, shell,
                               config_src, cwd, wait_pid)
    except OSError as e:  # a disk that filled up meanwhile: nothing half-made is left behind
        shutil.rmtree(run_dir, ignore_errors=True)
        point_back(spec["runs_dir"], run_id, previous)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return {"error": "disk-full", "message": no_space(spec["runs_dir"], 1 << 62) or str(e)}
        return {"error": "run-dir", "message": f"could not create run {run_id}: {e}"}


def _fill_and_start(spec: dict, archive: str, run_id: str, run_dir: str, checkpoint, resume, exec_mode: bool,  # noqa: ANN001
                    command, shell, config_src, cwd: str, wait_pid: bool) -> dict:  # noqa: ANN001
    resumed = take_checkpoint(checkpoint, run_dir, resume) if resume and checkpoint else None
    meta = dict(spec["meta"])
    if exec_mode:
        argv = list(command) if command is not None else [shutil.which("bash") or "/bin/sh", "-c", shell]
        meta["config"] = None
        if not meta.get("code_hash"):
            meta["code_hash"] = _recorded_hash(cwd)
    else:
        config = os.path.join(run_dir, "config.toml")
        if config_src is None:
            write_atomic(config, spec["config_text"].encode("utf-8"))
        else:
            with open(config_src, "rb") as f:
                write_atomic(config, f.read())
        argv = [spec["python"], *spec.get("runner", []), "-m", spec["module"], "--config", config, "--run-dir", run_dir,
                *spec["extra"]]
        meta["config"] = dict(meta.get("config") or {}, path=config, copied_from=config_src)
    meta.update({
        "id": run_id,
        "run_dir": run_dir,
        "argv": argv,
        "cwd": os.path.realpath(cwd),
        "started_at": now_iso(),
        "started_at_epoch": time.time(),
    })
    if resumed:
        meta["resumed_from"] = resumed
    restart = (spec.get("sentinel") or {}).get("restart")
    if restart and not meta.get("chain"):  # the first attempt of a launch that may restart
        meta.update(attempt=1, chain={"first": run_id, "previous": None, "attempt": 1,
                                      "attempts_max": 1 + int(restart.get("max_restarts") or 0)})
    env = _run_env(spec.get("env") or {}, run_id, run_dir)
    env.update(recorder_env(argv, env, run_dir))  # under torchrun: the NCCL flight recorder on (issue 28)
    write_meta(run_dir, meta)
    write_atomic(os.path.join(run_dir, "launch.json"),
                 json.dumps({"argv": argv, "cwd": cwd, "env": spec.get("env") or {},
                             "what": "program" if exec_mode else "trainer", "sentinel": spec.get("sentinel"),
                             "wait": spec.get("wait"), "gpu_health": spec.get("gpu_health")}).encode())
    os.chmod(os.path.join(run_dir, "launch.json"), 0o600)  # its env values and notify URLs: the owner's only
    with open(archive, "rb") as f:
        write_atomic(os.path.join(run_dir, AGENT_FILE), f.read())
    with open(os.path.join(run_dir, AGENT_FILE), "rb") as f:  # what every attempt and the sentinel will run
        if not trailer_holds(f.read()):
            raise OSError(errno.EIO, f"the run's copy of {archive} fails its trailer hash (was it changed meanwhile?)")
    write_atomic(os.path.join(run_dir, SPEC_FILE), json.dumps({k: v for k, v in spec.items() if k != "wait"}).encode())
    os.chmod(os.path.join(run_dir, SPEC_FILE), 0o600)
    log_fd = os.open(os.path.join(run_dir, "train.log"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    point_latest(spec["runs_dir"], run_id)

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
            os.execve(sys.executable, [sys.executable, os.path.join(run_dir, AGENT_FILE), "supervise", run_dir], env)
        except BaseException as e:  # noqa: BLE001 - nothing may escape a forked child
            os.write(2, f"[dflashctl] could not start the supervisor: {e}\n".encode())
            write_atomic(os.path.join(run_dir, "exit_code"), b"127\n")
        os._exit(127)
    os.close(log_fd)
    pid, exit_code = _wait_for_pid(run_dir, child, timeout=5.0) if wait_pid else (None, None)
    return {"run_id": run_id, "run_dir": run_dir, "pid": pid, "exit_code": exit_code, "supervisor": child,
            "resumed_from": resumed}


def _run_env(extra: dict, run_id: str, run_dir: str) -> dict:
    """The program's environment: ours (what `pct exec` left: with --clear-env only PATH and what the
    container's config sets), HOME/USER/LOGNAME from the passwd database where that cleared them (as a
    login would set them), the spec's variables (PYTHONUNBUFFERED=1, the user's --env), and the run's own."""
    env = dict(os.environ)
    with contextlib.suppress(KeyError):
        pw = pwd.getpwuid(os.getuid())
        env.setdefault("HOME", pw.pw_dir)
        env.setdefault("USER", pw.pw_name)
        env.setdefault("LOGNAME", pw.pw_name)
    env.update({str(k): str(v) for k, v in extra.items()})
    env.update(run_cache_env(os.path.dirname(os.path.dirname(run_dir)), env))  # the user's own always win
    env[MARKER] = run_id
    env[RUN_DIR_VAR] = run_dir
    return env


def _recorded_hash(cwd: str) -> str | None:
    try:
        with open(os.path.join(cwd, HASH_FILE)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _wait_for_pid(run_dir: str, child: int, timeout: float) -> tuple[int | None, int | None]:
    """The program's pid as the supervisor records it (or the exit code if it could not start)."""
    deadline = time.time() + timeout
    while True:
        pid = read_int(os.path.join(run_dir, "pid"))
        code = read_int(os.path.join(run_dir, "exit_code"))
        if pid is not None or code is not None or time.time() > deadline:
            return pid, code
        with contextlib.suppress(ChildProcessError):  # our child until we exit: reap it if it died early
            os.waitpid(child, os.WNOHANG)
        time.sleep(0.05)


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


def supervise_main(argv: list) -> int:
    """`supervise RUN_DIR` (agent/verbs.py)."""
    if len(argv) != 1:
        sys.stderr.write("usage: python3 agent.pyz supervise RUN_DIR\n")
        return 2
    return supervise(argv[0])


def supervise(run_dir: str) -> int:
    with open(os.path.join(run_dir, "launch.json")) as f:
        spec = json.load(f)
    exit_path = os.path.join(run_dir, "exit_code")
    with contextlib.suppress(OSError):  # only a liveness hint: never a reason to leave no exit_code
        write_atomic(os.path.join(run_dir, "supervisor.pid"), f"{os.getpid()}\n".encode())
    if spec.get("wait"):  # a restart: the backoff, the previous attempt gone, its GPUs' memory released
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _stop_waiting)
        try:
            waited = wait_before_start(spec["wait"], _say)
        except _StoppedWaiting:
            _say("stopped while waiting to start the next attempt; its program was never started")
            write_atomic(exit_path, b"143\n")
            return 0
        _say(f"restart: waited {waited['waited_s']:g} s; starting attempt "
             f"{(spec.get('sentinel') or {}).get('attempt')}")
        if spec["wait"].get("left_out"):
            _say(spec["wait"]["left_out"])
    try:
        proc = subprocess.Popen(spec["argv"], cwd=spec["cwd"], stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        _say(f"cannot start {spec['argv'][0]!r} in {spec['cwd']}: {e}")
        write_atomic(exit_path, b"127\n")
        return 127
    write_atomic(os.path.join(run_dir, "pid"), f"{proc.pid}\n".encode())
    sentinel = start_sentinel(run_dir, bool(spec.get("sentinel")), _say)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    rc = proc.wait()
    code = stopped_code(run_dir, spec["argv"], rc if rc >= 0 else 128 - rc)
    spare = (sentinel.pid,) if sentinel else ()
    leftovers = _reap_group(proc.pid) + _reap_marked(os.environ.get(MARKER), os.environ.get(RUN_DIR_VAR) or run_dir,
                                                     spare)
    note = f"; stopped {leftovers} leftover process(es) of the run" if leftovers else ""
    _say(f"{spec.get('what') or 'trainer'} exited with code {code}{note}")
    end_sentinel(sentinel, code, _say)
    unwritten: list = []
    if not try_write(exit_path, f"{code}\n".encode(), unwritten):  # a full disk: say so, and still relaunch
        _say(f"could not record the exit code {code}: {unwritten[0]}")
    relaunch(run_dir, start)
    return 0


def stopped_code(run_dir: str, argv: list[str], code: int) -> int:
    """torchrun (a node of a run across hosts) answers SIGTERM by stopping its workers (143 after their checkpoint),
    then exits 1 (its SignalException): a node our stop ended (its `stopped` marker) records 143, as a one-host run."""
    if code == 1 and "torch.distributed.run" in argv[1:3] and os.path.exists(os.path.join(run_dir, "stopped")):
        with contextlib.suppress(OSError), open(os.path.join(run_dir, "train.log"), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            tail = f.read()
            return 143 if b"SignalException: Process" in tail and b"got signal: 15" in tail else code
    return code


class _StoppedWaiting(Exception):
    pass


def _stop_waiting(_signum: int, _frame: object) -> None:
    raise _StoppedWaiting


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # train.log on a full disk: the supervisor goes on without its word
        sys.stderr.write(f"[dflashctl] {line}\n")
        sys.stderr.flush()


def _reap_group(pgid: int) -> int:
    """After the leader exits, nothing of the run may linger: SIGTERM the group, grace, SIGKILL, and wait until
    no member is left alive (reaping.end_group), so that `exit_code` present means the whole group is gone."""
    return 0 if end_group(pgid, GROUP_GRACE_S) is None else 1


def _reap_marked(run_id: str | None, run_dir: str, spare: tuple = ()) -> int:
    """Processes of this run outside the leader's group (torchrun starts each worker in a session of its own;
    a program may setsid a helper): found by the run's marker AND its DFLASH_RUN_DIR (a run of the same id in
    another workspace is not ours), each re-checked (start time, marker) before every signal; SIGTERM, grace,
    SIGKILL. spare: the run's sentinel, which ends after it has seen the end. Returns how many there were."""
    if not run_id:
        return 0
    found = marked_processes(run_id, run_dir, exclude=(os.getpid(), *spare))

    def still(pid: int) -> bool:
        st = proc_stat(pid)
        return st is not None and st["state"] not in ("Z", "X") and st["starttime"] == found[pid] \
            and proc_marker(pid) == run_id and proc_env_var(pid, RUN_DIR_VAR) == run_dir

    for sig, wait_s in ((signal.SIGTERM, GROUP_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
        for pid in [p for p in found if still(p)]:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.time() + wait_s
        while any(still(p) for p in found) and time.time() < deadline:
            time.sleep(0.05)
        if not any(still(p) for p in found):
            break
    return len(found)

