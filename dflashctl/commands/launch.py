"""launch: start a training run detached in the container, with its own directory, and prove it.

Every step the seed's engineer did by hand is done and checked here: the code deployed is the code
here; nothing of an earlier run is alive (else refuse, or clean with --kill-zombies); the log
exists before the trainer starts; the process is confirmed alive, or the failure is reported with
the log's first lines (exit 100). `wait` replaces the blind `sleep 600`.

The program is the bundled trainer (`python -m trainer --config … --run-dir …`), or any command: `--exec -- ARGV`
(byte-exact, no shell), `--shell CMD` (`bash -c CMD`), or the host's `command` from hosts.toml; it runs in
<workspace>/code with DFLASH_RUN_ID, DFLASH_RUN_DIR, PYTHONUNBUFFERED=1 and the user's `--env` (parse_env).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from dflashctl.analysis.progress import parse_progress
from dflashctl.commands import deploy as deploy_cmd
from dflashctl.commands import zombies
from dflashctl.commands._runs import RunInfo, run_from_probe, runs_dir
from dflashctl.commands.runs import get_run, list_runs
from dflashctl.commands.stop import gpu_memory
from dflashctl.errors import ConfigError, DflashError, ExitCode, NotFound
from dflashctl.model import Host
from dflashctl.remote import probe, scripts
from dflashctl.remote.target import Target

DEFAULT_CONFIG = "trainer/configs/tiny-cpu.toml"  # relative to <workspace>/code
NAME_MAX = 40
MIN_FREE_MIB = 1024.0
GPU_BUSY_MIB = 1024.0  # a requested GPU with more memory in use than this is held by someone
CONFIRM_S = 10.0
ALIVE_FOR_S = 2.0  # alive this long after start = launched (a program that dies at once never is)
WaitFor = Literal["started", "step", "exit"]


@dataclass
class LaunchOptions:
    name: str | None = None
    config: Path | None = None  # a local file, uploaded as <run-dir>/config.toml
    kill_zombies: bool = False
    extra: list[str] = field(default_factory=list)  # passed to the trainer after its own arguments
    source: Path | None = None  # the trainer tree to deploy when the container's is stale
    module: str = "trainer"  # `python -m MODULE` in <workspace>/code
    confirm_s: float | None = None  # how long confirm() may take (None: CONFIRM_S)
    confirm: bool = True  # False: return once it is started; the caller wait()s (one report, no window)
    resume_from: str | None = None  # a run id (or "latest"): start from its newest checkpoint, in a new run dir
    container_config: str | None = None  # a config path in the container (a run's config.toml); --config wins
    config_text: str | None = None  # the config itself (a job that needs none records what it is instead)
    meta: dict[str, object] = field(default_factory=dict)  # more meta.json fields (kind, job, evaluates …)
    command: list[str] | None = None  # --exec: this argv instead of the bundled trainer (no shell), in <workspace>/code
    shell: str | None = None  # --shell: `bash -c SHELL` (`sh -c` where there is no bash) instead
    env: dict[str, str] = field(default_factory=dict)  # --env: more variables for the program (parse_env)
    host_command: bool = False  # neither given: the host's `command` (hosts.toml) with `extra` appended, if it has one


@dataclass
class LaunchResult:
    run_id: str
    run_dir: str
    pid: int
    log_path: str
    name: str
    config: str | None  # None: a command of the user's (--exec, --shell, the host's `command`)
    notes: list[str]
    deployed: deploy_cmd.DeployResult | None = None
    killed: zombies.KillReport | None = None
    resumed_from: dict | None = None  # {"run", "checkpoint", "step", "linked"} as meta.json records it
    command: list[str] | None = None  # what was started instead of the bundled trainer (`bash -c CMD` for --shell)


class LaunchRefused(DflashError):
    """Preflight said no (exit 2). `rows` lists the processes in the way, for the CLI's table."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, hint: str | None = None, rows: list[zombies.ZombieRow] | None = None):
        super().__init__(message, hint=hint)
        self.rows = rows or []


class LaunchFailed(DflashError):
    """The run did not stay up (exit 100); `log_head` holds the first lines of its log."""

    exit_code = ExitCode.CRASHED

    def __init__(self, message: str, *, hint: str | None = None, log_head: str = "", run_id: str | None = None,
                 exit_code: int | None = None):
        super().__init__(message, hint=hint)
        self.log_head = log_head
        self.run_id = run_id
        self.run_exit_code = exit_code  # the run's own exit code (the CLI's is always 100)


def run_slug(name: str) -> str:
    """The id-safe form of a run name: [A-Za-z0-9._-] only. The name itself is kept byte-exact in
    meta.json; control characters (newlines) are refused, since they would garble every listing."""
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ConfigError(f"run name {name!r} contains a control character",
                          hint="use letters, digits, '.', '_' and '-'; spaces and quotes are replaced by '-'")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:NAME_MAX].strip("-.")
    if not slug:
        raise ConfigError(f"run name {name!r} has no letters or digits to build a run id from",
                          hint="pass --name with letters, digits, '.', '_' or '-'")
    return slug


def launch(target: Target, opts: LaunchOptions, *, say: Callable[[str], None] = lambda _m: None) -> LaunchResult:
    """Preflight, start, confirm. `say` receives progress notes (deployed, zombies cleaned)."""
    host = target.host
    command = program_argv(opts, host)  # None: the bundled trainer
    target.ensure_running()
    source_run = ended_run(target, opts.resume_from, "resume from it") if opts.resume_from is not None else None
    if command is None:
        config_text, config_label = _config(opts, opts.container_config
                                            or (source_run.config_path if source_run else host.config))
        default_name = source_run.name if source_run else Path(config_label).stem
    else:
        config_text, config_label, default_name = None, None, program_name(command)
    name = opts.name if opts.name is not None else default_name
    slug = run_slug(name)
    notes: list[str] = []

    killed = _clear_the_way(target, opts, notes, say)  # first: a refused launch changes nothing

    # Our trainer is deployed when stale, as is the user's code when we are told where it is (--source, the host's
    # code_source); a program launched with neither runs in whatever `deploy` shipped last.
    state = deployed = None
    if command is None or opts.source is not None or host.code_source:
        state = deploy_cmd.check(target, opts.source)
        if not state.current:
            why = "not deployed" if state.remote_hash is None else "stale"
            deployed = deploy_cmd.deploy(target, opts.source, state=state)
            notes.append(f"code in the container was {why}: deployed {deployed.hash[:12]} ({deployed.files} files)")
            say(notes[-1])
    doc = probe.probe_once(target, host.workspace, None, gpus=bool(_requested_gpus(host)), log_max=0)
    _check_disk(doc, host.workspace)
    _check_gpus(doc, _requested_gpus(host))

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    spec = {
        "runs_dir": runs_dir(host.workspace),
        "base_id": f"{stamp}-{slug}",
        "python": host.python,
        "cwd": f"{host.workspace.rstrip('/')}/code",
        "module": opts.module,
        # a resumed run keeps the source run's overrides; the ones given now come after them, so they win
        "extra": (["--resume", *source_run.extra] if source_run else []) + list(opts.extra),
        "resume_from": source_run.id if source_run else None,
        "config_text": config_text,
        "config_path": config_label if config_text is None else None,
        "command": opts.shell is None and command or None,
        "shell": opts.shell,
        "env": {"PYTHONUNBUFFERED": "1", **opts.env},
        "meta": {
            "name": name,
            "host": host.name,
            "container": host.container,
            "config": {"source": config_label, "uploaded": config_text is not None},
            "code_hash": deployed.hash if deployed else state.local_hash if state else None,
            "git_sha": _git_sha(state.source.path) if state and state.source else None,
            "gpus": {"target": list(host.gpus_target), "drafters": list(host.gpus_drafters)},
            "launched_by": "dflashctl",
            "kind": "train" if command is None else "exec",
            "env": sorted(opts.env),  # the names given with --env (their values are in launch.json)
            **({} if opts.shell is None else {"shell": opts.shell}),
            **opts.meta,
        },
    }
    res = scripts.call(target, "launcher", "launch", spec, pass_source=True, timeout=60)
    if res.get("error") == "run-alive":  # another launch got there between our preflight and now
        raise LaunchRefused(f"{res['message']} on {host.name} (started while this launch was checking)",
                            hint=f"stop it first: dflashctl stop {res['run_id']}")
    if res.get("error") == "config-missing":
        raise ConfigError(res["message"], hint="pass --config FILE, or set `config` for the host in hosts.toml")
    if res.get("error") == "code-missing":
        raise ConfigError(f"{res['message']} on {host.name}: --exec runs in <workspace>/code",
                          hint="deploy your code first (dflashctl deploy --source DIR), or pass --source DIR")
    if res.get("error") == "no-checkpoint":
        raise ConfigError(res["message"], hint="it saved none (train.checkpoint_interval, or it never reached one); "
                                               "launch a fresh run instead")
    if "error" in res:
        raise DflashError(f"launch on {host.name} failed: {res.get('message') or res['error']}",
                          exit_code=ExitCode.CRASHED)
    run_id, run_dir = res["run_id"], res["run_dir"]
    resumed = res.get("resumed_from")
    if resumed:
        how = "linked" if resumed.get("linked") else "copied"
        notes.append(f"resuming run {resumed['run']} from its checkpoint at step {resumed['step']} ({how} into "
                     f"{run_dir}/checkpoints)")
        say(notes[-1])
    started = None if command is None else (["bash", "-c", opts.shell] if opts.shell is not None else command)
    if not opts.confirm:  # the caller waits: wait() sees an early death and reports it with failure()
        return LaunchResult(run_id, run_dir, int(res.get("pid") or 0), f"{run_dir}/train.log", name, config_label,
                            notes, deployed, killed, resumed, started)
    info = confirm(target, run_id, opts.confirm_s)
    return LaunchResult(run_id, run_dir, int(info.pid or res.get("pid") or 0), f"{run_dir}/train.log", name,
                        config_label, notes, deployed, killed, resumed, started)


def program_argv(opts: LaunchOptions, host: Host) -> list[str] | None:
    """What the run starts: None for the bundled trainer, else the argv (`--exec`, or the host's `command` with the
    arguments after `--` appended; for `--shell` a placeholder, the launcher picks bash or sh). Usage errors (2) are
    raised here, before anything is contacted."""
    if opts.command is not None and opts.shell is not None:
        raise ConfigError("--exec and --shell both give the command; use one",
                          hint="--exec -- ARGV... (no shell), or --shell 'CMD' (run by bash -c)")
    if opts.shell is not None:
        if not opts.shell.strip():
            raise ConfigError("--shell was given an empty command", hint="--shell 'CMD' runs CMD with bash -c")
        if opts.extra:
            raise ConfigError("--shell takes the whole command line in one string; nothing may follow `--`",
                              hint="put the arguments into the --shell string")
        command: list[str] | None = ["bash", "-c", opts.shell]
    elif opts.command is not None:
        command = list(opts.command)
        if not command or not command[0]:
            raise ConfigError("--exec was given an empty command",
                              hint="put the program and its arguments after `--`: "
                                   "dflashctl launch --exec -- python train.py --config cfg.yaml")
    elif opts.host_command and host.command:
        command = [*host.command, *opts.extra]
    else:
        return None
    if opts.config is not None:
        raise ConfigError("--config is the bundled trainer's config; a command of your own takes its config in its "
                          "own arguments", hint="dflashctl launch --exec -- python train.py --config cfg.yaml "
                                                "(a path in the container, relative to <workspace>/code)")
    if opts.resume_from is not None:
        raise ConfigError("--resume-from continues a run of the bundled trainer; a command of your own resumes the "
                          "way it knows how", hint="pass your program's resume option after `--`; "
                                                   "$DFLASH_RUN_DIR is each run's own directory")
    return command


def program_name(argv: list[str]) -> str:
    """A run's default name from its command: the script (`train.py` -> train), the module after `-m`, else the
    program; `bash -c CMD` is named by CMD's first word."""
    if len(argv) == 3 and argv[:2] == ["bash", "-c"]:
        words = argv[2].split()
        return program_name(words) if words and words[0] not in ("bash", "sh") else "shell"
    for i, arg in enumerate(argv):
        if arg.endswith(".py") and i > 0:
            return Path(arg).stem
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1].rsplit(".", 1)[-1] or "exec"
    return Path(argv[0]).name or "exec"


_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RUN_VARIABLES = ("DFLASH_RUN_ID", "DFLASH_RUN_DIR")  # set by the launcher for every process of a run


def parse_env(items: list[str]) -> dict[str, str]:
    """--env KEY=VALUE (repeatable) -> {KEY: VALUE}; VALUE may be empty or contain '='. One-line usage errors."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise ConfigError(f"--env {item!r} is not KEY=VALUE (KEY: letters, digits and '_', not starting with "
                              "a digit)", hint="e.g. --env NCCL_DEBUG=INFO; repeat --env for each variable")
        if key in RUN_VARIABLES:
            raise ConfigError(f"--env {key}: dflashctl sets it for every run (the run's id and directory)",
                              hint="read it in your program instead")
        if "\0" in value:
            raise ConfigError(f"--env {key}: a value cannot contain a NUL byte")
        out[key] = value
    return out


@dataclass(frozen=True)
class EndedRun:
    """A run a new one starts from (resume, eval)."""

    id: str
    dir: str
    name: str
    config_path: str  # its config.toml, absolute, in the container: the new run's config unless --config
    extra: list[str]  # the trainer arguments it was launched with (its --set overrides)


def ended_run(target: Target, run: str, purpose: str) -> EndedRun:
    """The training run (id, or latest: the newest training run, evaluations skipped) a new run starts from: it
    must exist (else NotFound, 102), be a training run and have ended (else 2). Its checkpoint, where one is needed,
    is checked where it is used: under the launch lock."""
    if not run.strip():
        raise ConfigError("an empty run id was given", hint="name a run id from `dflashctl runs`, or latest")
    if run == "latest":
        training = [r for r in list_runs(target).runs if r.kind == "train"]
        if not training:
            raise NotFound(f"no training run on {target.host.name} to {purpose.split()[0]}",
                           hint="list runs with `dflashctl runs`")
        run = training[0].id
    info, _ = get_run(target, run)
    if info.kind != "train":
        raise ConfigError(f"run {info.id} is not a training run (kind {info.kind})",
                          hint="name the training run (see `dflashctl runs`)")
    if info.alive:
        raise LaunchRefused(f"run {info.id} is still running; {purpose} once it has ended",
                            hint=f"stop it first: dflashctl stop {info.id}")
    meta = info.meta or {}
    name = meta.get("name")
    return EndedRun(info.id, info.dir, name if isinstance(name, str) and name else info.id,
                    f"{info.dir}/config.toml", _trainer_args(meta.get("argv")))


def _trainer_args(argv: object) -> list[str]:
    """What followed `--run-dir DIR` in a run's argv (launch's extra arguments), without `--resume`."""
    if not isinstance(argv, list) or "--run-dir" not in argv:
        return []
    rest = argv[argv.index("--run-dir") + 2:]
    return [str(a) for a in rest if a != "--resume"]


def _config(opts: LaunchOptions, host_config: str | None) -> tuple[str | None, str]:
    if opts.config_text is not None:
        return opts.config_text, "(inline)"
    if opts.config is None:
        return None, host_config or DEFAULT_CONFIG
    path = Path(opts.config).expanduser()
    try:
        return path.read_text(encoding="utf-8"), str(path.resolve())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found", hint="--config takes a local TOML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None


def _clear_the_way(target: Target, opts: LaunchOptions, notes: list[str],
                   say: Callable[[str], None]) -> zombies.KillReport | None:
    found = zombies.scan(target)
    if found.current_run is not None:
        raise LaunchRefused(f"run {found.current_run} is still running on {target.host.name}; refusing to start "
                            "a second one beside it", hint=f"stop it first: dflashctl stop {found.current_run}")
    if not found.to_kill:
        return None
    if not opts.kill_zombies:
        raise LaunchRefused(f"{len(found.to_kill)} process(es) of earlier runs are still alive on "
                            f"{target.host.name}", rows=found.to_kill,
                            hint="launch again with --kill-zombies, or run `dflashctl kill-zombies`")
    report = zombies.kill(target, found)
    if report.failed:
        raise LaunchRefused(f"{len(report.failed)} zombie process(es) could not be ended", rows=report.failed,
                            hint="inspect them with `dflashctl kill-zombies --dry-run`")
    notes.append(f"ended {len(report.ended)} zombie process(es) of earlier runs")
    say(notes[-1])
    return report


def _requested_gpus(host) -> tuple[int, ...]:
    return tuple(sorted(set(host.gpus_target) | set(host.gpus_drafters)))


def _check_disk(doc: dict, workspace: str) -> None:
    disk = doc.get("disk") or {}
    free = disk.get("free_mib")
    if free is not None and free < MIN_FREE_MIB:
        raise LaunchRefused(f"only {free:.0f} MiB free on {disk.get('path') or workspace}; a run needs at least "
                            f"{MIN_FREE_MIB:.0f} MiB for its logs and checkpoints",
                            hint="remove old run directories under <workspace>/runs")


def _check_gpus(doc: dict, requested: tuple[int, ...]) -> None:
    if not requested:
        return
    used = gpu_memory(doc.get("gpus"))
    if not used:
        return
    held = {i: used[i] for i in requested if used.get(i, 0.0) > GPU_BUSY_MIB}
    if held:
        listing = ", ".join(f"GPU {i}: {mib:.0f} MiB" for i, mib in held.items())
        raise LaunchRefused(f"requested GPUs are in use by processes of no live run ({listing})",
                            hint="find the holders with `dflashctl kill-zombies --dry-run`")


def _git_sha(source: Path) -> str | None:
    """The commit of the local tree the trainer came from, read from .git without running git."""
    for d in (source, *source.parents):
        head = d / ".git" / "HEAD"
        if head.is_file():
            ref = head.read_text().strip()
            if not ref.startswith("ref: "):
                return ref or None
            path = d / ".git" / ref[5:]
            if path.is_file():
                return path.read_text().strip() or None
            packed = d / ".git" / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref[5:]):
                        return line.split()[0]
            return None
    return None


class LogKeeper:
    """The log of a run being watched, kept bounded: its first KEEP bytes and its last KEEP bytes — what the
    report of a failed run shows (the first lines, and the error lines at the end)."""

    KEEP = 64 << 10

    def __init__(self) -> None:
        self.head = b""
        self.tail = b""
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.KEEP - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail = (self.tail + data)[-self.KEEP:]

    @property
    def text(self) -> bytes:
        """head and tail joined; a gap between them is marked by a line of its own."""
        if not self.tail:
            return self.head
        gap = self.total - len(self.head) - len(self.tail)
        joint = b"\n[... %d bytes ...]\n" % gap if gap > 0 else b""
        return self.head + joint + self.tail


HEAD_LINES = 20
ERROR_LINES = 40


def failure(run_id: str, info: RunInfo, log: bytes) -> LaunchFailed:
    """The one report of a run that died before the command got what it waited for (issue 10): the same text,
    exit code and JSON whether it died inside confirm()'s alive window or just after it, while wait() watched.
    It says how the run ended, never how long that took, so no part of it depends on the machine's speed."""
    why = (f"exited with code {info.exit_code}" if info.exit_code is not None
           else "was stopped" if info.stopped
           else "exited (its supervisor is still stopping leftovers of its process group)" if info.ending
           else "ended without an exit code (killed, or its supervisor died)" if info.pid is not None
           else "never started")
    return LaunchFailed(f"run {run_id} {why}", log_head=log_excerpt(log), run_id=run_id, exit_code=info.exit_code,
                        hint=f"whole log: dflashctl logs {run_id}")


def log_excerpt(log: bytes) -> str:
    """The first HEAD_LINES lines, and, where the log goes on past them, its last traceback or exception line
    (the error lines a person scrolls down for)."""
    from dflashctl.analysis.logscan import scan

    lines = log.decode("utf-8", "replace").splitlines()
    out = lines[:HEAD_LINES]
    if len(lines) <= HEAD_LINES:
        return "\n".join(out)
    report = scan(log)
    last = next((tb for tb in reversed(report.tracebacks) if not tb.ignored), None)
    if last is None or last.last_line <= HEAD_LINES:
        return "\n".join(out + (["…"] if len(lines) > HEAD_LINES else []))
    first = max(last.first_line, HEAD_LINES + 1, last.last_line - ERROR_LINES + 1)
    skipped = first - HEAD_LINES - 1
    return "\n".join(out + ([f"… ({skipped} lines) …"] if skipped else []) + lines[first - 1:last.last_line])


def confirm(target: Target, run_id: str, within_s: float | None = None) -> RunInfo:
    """Alive for ALIVE_FOR_S with train.log present: launched (a run that already finished with exit
    code 0 counts too: short runs are real runs). Dead otherwise: failure() — the same report wait() gives
    a run that dies after this window."""
    deadline = time.monotonic() + (CONFIRM_S if within_s is None else within_s)
    start = time.monotonic()
    log = LogKeeper()
    dead_since: float | None = None
    stream = probe.probe_stream(target, target.host.workspace, run_id, 0, 0.25, gpus=False, log_max=64 << 10)
    try:
        for doc in stream:
            info = run_from_probe(doc["run"])
            log.add(probe.decode_log(doc))
            if not info.alive and info.exit_code == 0:
                return info
            if not info.alive and info.exit_code is not None:
                break
            if not info.alive and info.pid is not None:  # dead: give the supervisor a moment to record why
                dead_since = dead_since or time.monotonic()
                if time.monotonic() - dead_since > 2.0:
                    break
            # an ending run's trainer already exited: wait for the exit code its supervisor records after the reaping
            started = info.alive and not info.ending and doc.get("log") is not None
            if started and time.monotonic() - start >= ALIVE_FOR_S:
                return info
            if time.monotonic() > deadline:
                break
    finally:
        stream.close()
    if info.alive and not info.ending:  # alive but no train.log: the one thing that must never happen
        raise LaunchFailed(f"run {run_id}: process alive but {info.log_path} is missing",
                           log_head=log_excerpt(log.text), run_id=run_id)
    raise failure(run_id, info, log.text)


@dataclass
class WaitResult:
    reached: bool
    run: RunInfo
    line: str | None  # the first training step line seen (what --wait-for step waits for)
    waited_s: float
    log: LogKeeper = field(default_factory=LogKeeper)

    @property
    def exit_code(self) -> int:
        """DESIGN §5: 0 reached (or finished), 100 crashed/lost, 103 stopped, 101 timed out."""
        if self.reached:
            return int(self.run.verdict().exit_code) if not self.run.alive else 0
        if self.run.alive:
            return int(ExitCode.NOT_FINISHED)
        return int(self.run.verdict().exit_code)

    def died_early(self, ok_codes: tuple[int, ...] = (0,)) -> bool:
        """It ended in failure before its first training step (or, for a job that logs no steps, at all): the
        program died at once, as far as the person waiting can tell — the case failure() reports."""
        run = self.run
        if run.alive or run.stopped or self.line is not None:
            return False
        return run.exit_code not in ok_codes

    def failure(self) -> LaunchFailed:
        return failure(self.run.id, self.run, self.log.text)


_STEP_FIRST = re.compile(r"\s*(?:step|iter)\b", re.IGNORECASE)


def is_training_step(line: str) -> bool:
    """A line saying a training step happened: a progress line with a loss, or one that starts with its step
    (`step=12 …`, `iter 100: …`). `resume: continuing from checkpoint step=285` and `eval step=100 …` name a step
    but are not one."""
    point = parse_progress(line, 0)
    if point is None or point.kind != "train":
        return False
    return "loss" in point.values or ("step" in point.values and bool(_STEP_FIRST.match(line)))


def wait(target: Target, run_id: str, what: WaitFor, timeout_s: float | None,
         on_log: Callable[[bytes], None] | None = None) -> WaitResult:
    """Block until the run has started / printed its first step / ended, or it died, or timeout. The log is
    kept (bounded) so that a run that died early is reported by failure(), exactly as confirm() reports it."""
    start = time.monotonic()
    pending = b""
    first_step: str | None = None
    log = LogKeeper()
    stream = probe.probe_stream(target, target.host.workspace, run_id, 0, 0.5, gpus=False)
    info: RunInfo | None = None

    def result(reached: bool) -> WaitResult:
        assert info is not None
        return WaitResult(reached, info, first_step, time.monotonic() - start, log)

    try:
        for doc in stream:
            info = run_from_probe(doc["run"])
            data = probe.decode_log(doc)
            if on_log and data:
                on_log(data)
            log.add(data)
            if first_step is None:  # one scan per line until the first training step, then no more
                pending += data
                lines = pending.split(b"\n")
                pending = lines.pop()[-(1 << 20):]
                first_step = next((t.strip() for t in (raw.decode("utf-8", "replace") for raw in lines)
                                   if is_training_step(t)), None)
                if first_step is not None and what == "step":
                    return result(True)
            drained = (doc.get("log") or {}).get("next_offset", 0) >= (doc.get("log") or {}).get("size", 0)
            ended = not info.alive and (info.exit_code is not None or info.pid is not None)
            if what == "started" and info.alive and not info.ending:
                return result(True)
            if ended and drained:
                return result(what == "exit")
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                return result(False)
    finally:
        stream.close()
    return result(False)
