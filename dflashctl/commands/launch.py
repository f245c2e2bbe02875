"""launch: start a training run detached in the container, with its own directory, and prove it.

Every step the seed's engineer did by hand is done and checked here: the code deployed is the code
here; nothing of an earlier run is alive (else refuse, or clean with --kill-zombies); the log
exists before the trainer starts; the process is confirmed alive, or the failure is reported with
the log's first lines (exit 100). `wait` replaces the blind `sleep 600`.

The program is the bundled trainer (`python -m trainer --config … --run-dir …`), or any command: `--exec -- ARGV`
(byte-exact, no shell), `--shell CMD` (`bash -c CMD`), or the host's `command` from hosts.toml; it runs in
<workspace>/code with DFLASH_RUN_ID, DFLASH_RUN_DIR, PYTHONUNBUFFERED=1 and the user's `--env` (parse_env).

Here: preflight, start, confirm. What to start (program, name, env, config) is decided in program.py; watching a run
and the report of one that died early are in waiting.py; callers import those names from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dflashctl.analysis.gpus import memory_by_index
from dflashctl.analysis.verdict import EndWatch
from dflashctl.commands import deploy as deploy_cmd
from dflashctl.commands import zombies
from dflashctl.commands.launch_gpus import configured_gpus, plan, program_words
from dflashctl.commands.program import (
    LaunchOptions,
    git_sha,
    program_argv,
    program_name,
    read_config,
    run_slug,
)
from dflashctl.commands.runlookup import RunInfo, run_from_probe, runs_dir
from dflashctl.commands.runs import get_run, list_runs
from dflashctl.commands.sentinel import sentinel_spec
from dflashctl.commands.waiting import LaunchFailed, LogKeeper, WaitResult, failure, log_excerpt
from dflashctl.errors import ConfigError, DflashError, ExitCode, NotFound
from dflashctl.remote import agentcall, agentpack, probe
from dflashctl.remote.target import Target
from dflashctl.report import ProbeReport

# Tests patch CONFIRM_S, ALIVE_FOR_S and MIN_FREE_MIB on this module: confirm() and _check_disk() read them here.

MIN_FREE_MIB = 1024.0
GPU_BUSY_MIB = 1024.0  # a requested GPU with more memory in use than this is held by someone
CONFIRM_S = 10.0
ALIVE_FOR_S = 2.0  # alive this long after start = launched (a program that dies at once never is)


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
    host: str = ""  # the host's name in hosts.toml

    def to_record(self, wait: WaitResult | None = None) -> dict[str, Any]:
        """`launch --json`: the run started, and with --wait-for what the wait saw."""
        rec: dict[str, Any] = {"host": self.host, "run_id": self.run_id, "run_dir": self.run_dir, "pid": self.pid,
                               "log": self.log_path, "name": self.name, "config": self.config, "notes": self.notes,
                               "resumed_from": self.resumed_from}
        if wait is not None:
            rec["wait"] = wait.to_record()
        return rec


class LaunchRefused(DflashError):
    """Preflight said no (exit 2). `rows` lists the processes in the way, for the CLI's table."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, hint: str | None = None, rows: list[zombies.ZombieRow] | None = None):
        super().__init__(message, hint=hint)
        self.rows = rows or []


def launch(target: Target, opts: LaunchOptions, *, say: Callable[[str], None] = lambda _m: None) -> LaunchResult:
    """Preflight, start, confirm. `say` receives progress notes (deployed, zombies cleaned)."""
    host = target.host
    command = program_argv(opts, host)  # None: the bundled trainer
    watch = sentinel_spec(host, opts.watch)  # every flag checked before the container is contacted
    target.ensure_running()
    source_run = ended_run(target, opts.resume_from, "resume from it") if opts.resume_from is not None else None
    if command is None:
        config_text, config_label = read_config(opts, opts.container_config
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
    want_gpus = bool(configured_gpus(host)) or opts.exclude_unhealthy_gpus
    doc = probe.probe_once(target, host.workspace, None, gpus=want_gpus, log_max=0, xid=opts.exclude_unhealthy_gpus)
    _check_disk(doc, host.workspace)
    _check_gpus(doc, configured_gpus(host))
    env = dict(opts.env)
    gpu_health = None
    if opts.exclude_unhealthy_gpus:  # the rule a restart applies again (analysis/gpuexclude.py)
        gpus = plan(doc, host, env, program_words(command if opts.shell is None else None, opts.shell, opts.runner),
                    trainer=command is None)
        env.update(gpus.env)
        gpu_health = gpus.record
        for note in gpus.notes:
            notes.append(note)
            say(note)

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    spec = {
        "runs_dir": runs_dir(host.workspace),
        "base_id": opts.run_id or f"{stamp}-{slug}",
        "exact_id": opts.run_id is not None,
        "runner": list(opts.runner),
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
        "env": {"PYTHONUNBUFFERED": "1", **env},
        "slug": slug,
        "sentinel": watch.to_record() if watch else None,
        "gpu_health": gpu_health,
        "meta": {
            "name": name,
            "host": host.name,
            "container": host.container,
            "config": {"source": config_label, "uploaded": config_text is not None},
            "code_hash": deployed.hash if deployed else state.local_hash if state else None,
            "git_sha": git_sha(state.source.path) if state and state.source else None,
            "gpus": {"target": list(host.gpus_target), "drafters": list(host.gpus_drafters)},
            "launched_by": "dflashctl",
            "kind": "train" if command is None else "exec",
            "sentinel": {"sha256": agentpack.sha256()} if watch else None,  # the agent archive it runs from
            "env": sorted(opts.env),  # the names given with --env (their values are in launch.json)
            **({} if opts.shell is None else {"shell": opts.shell}),
            **opts.meta,
        },
    }
    res = agentcall.call(target, "launch", spec, timeout=60)
    if res.get("error") == "run-alive":  # another launch got there between our preflight and now
        raise LaunchRefused(f"{res['message']} on {host.name} (started while this launch was checking)",
                            hint=f"stop it first: dflashctl stop {res['run_id']}")
    if res.get("error") == "disk-full":  # checked before anything is made; nothing half-made is left (launcher.py)
        raise LaunchRefused(f"{res['message']} on {host.name}; nothing was created",
                            hint="free some space there (old runs, checkpoints) and launch again")
    if res.get("error") == "config-missing":
        raise ConfigError(res["message"], hint="pass --config FILE, or set `config` for the host in hosts.toml")
    if res.get("error") == "code-missing":
        raise ConfigError(f"{res['message']} on {host.name}: --exec runs in <workspace>/code",
                          hint="deploy your code first (dflashctl deploy --source DIR), or pass --source DIR")
    if res.get("error") == "notify-unreachable":
        raise ConfigError(res["message"], hint="check the URL, or whether the container can reach it "
                                               "(a proxy? a firewall?); --notify none launches without it")
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
                            notes, deployed, killed, resumed, started, host.name)
    info = confirm(target, run_id, opts.confirm_s)
    return LaunchResult(run_id, run_dir, int(info.pid or res.get("pid") or 0), f"{run_dir}/train.log", name,
                        config_label, notes, deployed, killed, resumed, started, host.name)


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
    return EndedRun(info.id, info.dir, info.meta.name or info.id, f"{info.dir}/config.toml",
                    _trainer_args(info.meta.argv))


def _trainer_args(argv: tuple[str, ...]) -> list[str]:
    """What followed `--run-dir DIR` in a run's argv (launch's extra arguments), without `--resume`."""
    if "--run-dir" not in argv:
        return []
    rest = argv[argv.index("--run-dir") + 2:]
    return [str(a) for a in rest if a != "--resume"]


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


def _check_disk(doc: ProbeReport, workspace: str) -> None:
    disk = doc.disk
    free = disk.free_mib if disk else None
    if disk is not None and free is not None and free < MIN_FREE_MIB:
        raise LaunchRefused(f"only {free:.0f} MiB free on {disk.path or workspace}; a run needs at least "
                            f"{MIN_FREE_MIB:.0f} MiB for its logs and checkpoints",
                            hint="remove old run directories under <workspace>/runs")


def _check_gpus(doc: ProbeReport, requested: tuple[int, ...]) -> None:
    if not requested:
        return
    used = memory_by_index(doc.gpus)
    if not used:
        return
    held = {i: used[i] for i in requested if used.get(i, 0.0) > GPU_BUSY_MIB}
    if held:
        listing = ", ".join(f"GPU {i}: {mib:.0f} MiB" for i, mib in held.items())
        raise LaunchRefused(f"requested GPUs are in use by processes of no live run ({listing})",
                            hint="find the holders with `dflashctl kill-zombies --dry-run`")


def confirm(target: Target, run_id: str, within_s: float | None = None) -> RunInfo:
    """Alive for ALIVE_FOR_S with train.log present: launched (a run that already finished with exit
    code 0 counts too: short runs are real runs). Dead otherwise: failure() — the same report wait() gives
    a run that dies after this window."""
    deadline = time.monotonic() + (CONFIRM_S if within_s is None else within_s)
    start = time.monotonic()
    log = LogKeeper()
    end = EndWatch()  # dead with no exit code: lost only after the grace (analysis/verdict.py)
    stream = probe.probe_stream(target, target.host.workspace, run_id, 0, 0.25, gpus=False, log_max=64 << 10)
    try:
        for doc in stream:
            assert doc.run is not None  # the stream is for one named run: the probe reports it
            info = run_from_probe(doc.run)
            log.add(doc.log_data)
            if not info.alive and (info.exit_code == 0 or (info.exit_code is not None and info.restart)):
                return info  # finished, or ended with its sentinel's restart pending: the launch started a chain
            if not info.alive and info.exit_code is not None:
                break
            if info.pid is not None and end.see(info.process, doc.time or time.time()) == "ended":
                break
            # an ending run's trainer already exited: wait for the exit code its supervisor records after the reaping
            started = info.alive and not info.ending and doc.log is not None
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


