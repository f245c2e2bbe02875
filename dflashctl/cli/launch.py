"""CLI verbs that start a run: launch, eval, generate (each a run of its own) and adopt (a process started by hand).

Each verb parses, calls one function in commands/, renders, and raises common.Exit with the documented code
(DESIGN §5). The text and --json of a verb come from the same result record (its to_record()).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dflashctl import bounds
from dflashctl.cli.app import app
from dflashctl.cli.cluster import ClusterOpt, launch_across, pick
from dflashctl.cli.common import Exit, HostOpt, HostsOpt, JsonOpt, err, escape, open_target, out, print_json, show
from dflashctl.errors import ConfigError

if TYPE_CHECKING:  # each verb imports its command module itself: `status` should not pay for `launch`
    from dflashctl.commands import waiting
    from dflashctl.commands.sentinel import WatchOptions
    from dflashctl.remote import Target

SourceOpt = typer.Option(None, "--source", metavar="DIR",
                         help="code to deploy when the container's is stale: any directory (default: the host's "
                              "code_source, else the trainer installed with dflashctl)")
KillZombiesOpt = typer.Option(False, "--kill-zombies", help="end processes of earlier runs first")
_W = "Sentinel"  # the help panel of the run-sentinel options


def _watch_opts(sentinel: bool | None, notify: list[str] | None, notify_on: str | None, on_worker_failure: str | None,
                idle_limit: str | None, stall_limit: str | None, restart_on: str | None, max_restarts: int | None,
                backoff: str | None) -> WatchOptions:
    from dflashctl.commands.sentinel import WatchOptions

    return WatchOptions(enabled=sentinel, notify=notify, notify_on=notify_on, on_worker_failure=on_worker_failure,
                        idle_limit=idle_limit, stall_limit=stall_limit, restart_on=restart_on,
                        max_restarts=max_restarts, backoff=backoff)


def _say(json_out: bool) -> Callable[[str], None]:
    """Progress notes (deployed, zombies ended) go to stderr, dimmed; --json keeps stdout and stderr quiet."""
    return (lambda m: None) if json_out else (lambda m: err(f"[dim]{escape(m)}[/]"))


@app.command("launch")
def launch(
    extra: list[str] | None = typer.Argument(None, metavar="[-- ARGS...]",
                                             help="trainer arguments (after its own), or with --exec the command "
                                                  "itself, byte-exact, no shell"),
    exec_: bool = typer.Option(False, "--exec", help="run the command after `--` (any program: python train.py, "
                                                      "torchrun …) in <workspace>/code instead of the bundled trainer"),
    shell: str | None = typer.Option(None, "--shell", metavar="CMD",
                                     help="run CMD with `bash -c` (sh where there is no bash) instead of the trainer"),
    env: list[str] | None = typer.Option(None, "--env", "-e", metavar="KEY=VALUE",
                                         help="set a variable for the run's program (repeatable)"),
    name: str | None = typer.Option(None, "--name", "-n",
                                    help="run name (default: the config's file stem, or the command's script)"),
    config: Path | None = typer.Option(None, "--config", "-c", metavar="FILE",
                                       help="local TOML config, uploaded as <run-dir>/config.toml "
                                            "(default: the host's `config`, else trainer/configs/tiny-cpu.toml)"),
    kill_zombies: bool = KillZombiesOpt,
    exclude_unhealthy_gpus: bool = typer.Option(False, "--exclude-unhealthy-gpus",
                                                help="leave out GPUs with critical health findings (uncorrectable "
                                                     "ECC, pending/failed row remaps, Xid 48/79/94/95), at launch "
                                                     "and again before each restart: the program gets the rest as "
                                                     "CUDA_VISIBLE_DEVICES; refused when fewer remain than its "
                                                     "ranks per node, or when the host's configured GPUs are hit"),
    resume_from: str | None = typer.Option(None, "--resume-from", metavar="RUN",
                                           help="continue an ended run (id or latest) from its newest checkpoint, "
                                                "in a new run directory, with its config unless --config"),
    wait_for: str = typer.Option("started", "--wait-for", metavar="started|step|exit",
                                 help="return once the run has started, printed its first training step, or ended"),
    timeout: float | None = typer.Option(None, "--timeout", metavar="S", callback=bounds.option(bounds.TIMEOUT_S),
                                         help="give up waiting after S seconds (exit 101; the run keeps going)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="stream the log until the run ends (Ctrl-C detaches)"),
    source: Path | None = SourceOpt,
    sentinel: bool | None = typer.Option(None, "--sentinel/--no-sentinel", rich_help_panel=_W,
                                         help="watch the run from inside the container (default: on, or the "
                                              "host's `sentinel`)"),
    notify: list[str] | None = typer.Option(None, "--notify", metavar="TARGET", rich_help_panel=_W,
                                            help="send events to webhook:URL, slack:URL, ntfy:URL or command:CMD "
                                                 "(a bare URL is a JSON webhook; repeatable; `none`: not the "
                                                 "host's targets either)"),
    notify_on: str | None = typer.Option(None, "--notify-on", metavar="KINDS", rich_help_panel=_W,
                                         help="event kinds to notify: all, default, or a list such as "
                                              "default,first-step,-ended"),
    on_worker_failure: str | None = typer.Option(None, "--on-worker-failure", metavar="stop|keep",
                                                 rich_help_panel=_W,
                                                 help="when a worker thread or rank dies: stop the run (frees its "
                                                      "GPUs) or keep it going (reported)"),
    idle_limit: str | None = typer.Option(None, "--idle-limit", metavar="UTIL%@TIME", rich_help_panel=_W,
                                          help="stop the run when its GPUs hold memory below UTIL% for TIME "
                                               "(e.g. 5%@30m)"),
    stall_limit: str | None = typer.Option(None, "--stall-limit", metavar="TIME", rich_help_panel=_W,
                                           help="stop the run when no new step comes for TIME after the first "
                                                "(e.g. 20m)"),
    restart_on: str | None = typer.Option(None, "--restart-on", metavar="crashed,stalled,ID…", rich_help_panel=_W,
                                          help="start a new attempt (new run dir, resumed from the newest "
                                               "checkpoint) when one ends this way, or with this cause (signature "
                                               "ids: nccl-timeout,host-oom); never on import-error or a config "
                                               "error"),
    max_restarts: int | None = typer.Option(None, "--max-restarts", metavar="N", rich_help_panel=_W,
                                            help="at most N restarts (default 1 with --restart-on)"),
    backoff: str | None = typer.Option(None, "--backoff", metavar="TIME", rich_help_panel=_W,
                                       help="wait TIME before each restart (default 10s)"),
    cluster: str | None = ClusterOpt,
    rendezvous_port: int | None = typer.Option(None, "--rendezvous-port", metavar="PORT", min=1, max=65535,
                                               help="across hosts: torchrun's port on the first host (29500)"),
    nproc_per_node: int | None = typer.Option(None, "--nproc-per-node", metavar="N", min=1,
                                              help="across hosts: trainer processes per host (1)"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Start a run detached in the container, with its own run directory: the bundled trainer, or any command.
    With --cluster NAME or --host pve1,pve2: one run across those hosts (torchrun on each, rendezvous on the first).

    Each run gets a sentinel inside the container: it writes <run>/events.jsonl and, with --notify, tells you about
    a crashed worker, a stall or the end while your laptop is closed."""
    if wait_for not in ("started", "step", "exit"):
        raise ConfigError(f"--wait-for must be started, step or exit (got {wait_for!r})")
    from dflashctl.commands import launch as launch_cmd
    from dflashctl.commands import waiting
    from dflashctl.commands.program import parse_env

    words = list(extra or [])
    opts = launch_cmd.LaunchOptions(name=name, config=config, kill_zombies=kill_zombies,
                                    extra=[] if exec_ else words, command=words if exec_ else None, shell=shell,
                                    env=parse_env(list(env or [])), host_command=True,
                                    source=source, resume_from=resume_from,
                                    exclude_unhealthy_gpus=exclude_unhealthy_gpus,
                                    confirm=wait_for == "started" and not follow,
                                    watch=_watch_opts(sentinel, notify, notify_on, on_worker_failure, idle_limit,
                                                      stall_limit, restart_on, max_restarts, backoff))
    inv, across = pick(hosts, host, cluster, rendezvous_port=rendezvous_port, nproc_per_node=nproc_per_node)
    if across is not None:
        if follow or wait_for != "started":
            raise ConfigError("--follow and --wait-for step|exit follow one host; a run across hosts returns once "
                              "every node has started", hint="then: dflashctl status RUN --cluster NAME")
        launch_across(inv, across, opts, json_out)
    with open_target(hosts, host) as target:
        with _launch_errors(target, json_out):
            res = launch_cmd.launch(target, opts, say=_say(json_out))
        if not json_out:
            out(f"launched run [bold]{res.run_id}[/] on {target.host.label}")
            out(f"  pid  {res.pid}\n  log  {res.log_path}", markup=False)
            out(f"  next dflashctl status | dflashctl logs -f {res.run_id} | dflashctl stop {res.run_id}",
                markup=False, soft_wrap=True)
        code, result = 0, None
        if follow:
            from dflashctl.cli.runs import follow_log  # imported here: runs' verbs register after these in --help

            code = follow_log(target, res.run_id, from_start=True)
        elif wait_for != "started":
            with _launch_errors(target, json_out):
                result = waiting.wait(target, res.run_id, wait_for, timeout)  # type: ignore[arg-type]
                if result.died_early():
                    raise result.failure()
            code = result.exit_code
            if not json_out:
                _say_wait(wait_for, result, timeout)
        if json_out:
            print_json(res.to_record(result))
        raise Exit(code)


@app.command("eval")
def evaluate(
    run: str = typer.Argument("latest", metavar="[RUN]", help="the run whose drafter to evaluate (id or latest)"),
    extra: list[str] | None = typer.Argument(None, metavar="[-- EVAL_ARGS...]",
                                             help="more trainer.eval arguments: --limit N, --max-new-tokens N, "
                                                  "--device cuda:5, --target-devices …"),
    prompts: str = typer.Option(..., "--prompts", "-p", metavar="PATH",
                                help="prompt JSONL or generated data directory in the container (relative to "
                                     "<workspace>/code, e.g. trainer/prompts/eval.jsonl)"),
    untrained: bool = typer.Option(False, "--untrained", help="the step-0 drafter of its config: the τ baseline"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="wait for the report (else print the eval run's id)"),
    timeout: float | None = typer.Option(None, "--timeout", metavar="S", callback=bounds.option(bounds.TIMEOUT_S),
                                         help="give up waiting after S seconds (exit 101; the evaluation goes on)"),
    kill_zombies: bool = KillZombiesOpt,
    source: Path | None = SourceOpt,
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Measure a run's drafter: acceptance length τ by real speculative decoding, as a run of its own."""
    from dflashctl.commands import evaluate as eval_cmd

    extra = list(extra or [])
    if run.startswith("-"):  # `eval -- --limit 2`: after `--` every word is positional, the first one lands in RUN;
        run, extra = "latest", [run, *extra]  # no run id starts with '-', so it is an eval argument
    opts = eval_cmd.EvalOptions(run=run, prompts=prompts, untrained=untrained, extra=extra, source=source,
                                kill_zombies=kill_zombies, confirm=not wait)
    say = _say(json_out)
    with open_target(hosts, host) as target:
        with _launch_errors(target, json_out):
            job = eval_cmd.start(target, opts, say=say)
        res = job.run
        say(f"evaluating as run {res.run_id} (log {res.log_path})")
        if not wait:
            if json_out:
                print_json(job.to_record())
            else:
                out(res.run_id, markup=False)
            raise Exit(0)
        job.wait = _wait_job(target, res.run_id, timeout, json_out, ok_codes=(0, 1))
        if job.wait.reached and job.wait.run.exit_code in (0, 1):  # 1: it ran, but the lossless check failed
            job.report = report = eval_cmd.report(target, res.run_dir)
            if not json_out:
                tau = report.get("tau")
                speedup = report.get("speedup")
                out(f"τ {'n/a' if tau is None else f'{tau:.3f}'} (block {report['block_size']}) · tokens per "
                    f"target forward {report['tokens_per_forward']:.3f}"
                    f"{'' if speedup is None else f' · speedup {speedup:.2f}x'} · lossless {report['lossless_count']}/"
                    f"{report['num_prompts']} · {'untrained (step 0)' if report.get('untrained') else 'trained'} "
                    f"drafter of run {job.evaluates.id} · report {res.run_dir}/{eval_cmd.REPORT}", markup=False)
        elif not json_out:
            _say_wait("exit", job.wait, timeout)
        if json_out:
            print_json(job.to_record())
        raise Exit(job.wait.exit_code)


@app.command("generate")
def generate(
    extra: list[str] | None = typer.Argument(None, metavar="[-- GENERATE_ARGS...]",
                                             help="more `trainer.data generate` arguments: --limit N, --sample, "
                                                  "--max-new-tokens N, --devices cuda:0,cuda:1 …; with --server: "
                                                  "--concurrency N, --retries N, --timeout S, --model NAME, "
                                                  "--temperature T"),
    target_model: str = typer.Option(..., "--target", "-t", metavar="CKPT",
                                     help="Hugging Face checkpoint directory in the container (Qwen3 / Llama); "
                                          "with --server only its tokenizer is read"),
    prompts: str = typer.Option(..., "--prompts", "-p", metavar="PATH",
                                help="prompt JSONL in the container (relative to <workspace>/code, or absolute)"),
    out_dir: str = typer.Option(..., "--out", "-o", metavar="DIR",
                                help="data directory to write in the container; the same command again resumes it"),
    server: str | None = typer.Option(None, "--server", metavar="URL",
                                      help="an OpenAI-compatible server of the target (SGLang, vLLM) answers "
                                           "instead of Hugging Face generate; the URL as the container reaches it"),
    thinking: str | None = typer.Option(None, "--thinking", metavar="on|off",
                                        help="the chat template's enable_thinking (Qwen3), sent to the server and "
                                             "used to tokenize; default: the model's default"),
    name: str | None = typer.Option(None, "--name", "-n", help="run name (default: datagen-<out dir name>)"),
    wait: bool = typer.Option(False, "--wait", help="stream the log until it ends (else return once it runs)"),
    timeout: float | None = typer.Option(None, "--timeout", metavar="S", callback=bounds.option(bounds.TIMEOUT_S),
                                         help="with --wait: give up after S seconds (exit 101; it goes on)"),
    kill_zombies: bool = KillZombiesOpt,
    source: Path | None = SourceOpt,
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Let the target answer a prompt set (training data), in the container, as a run of its own."""
    from dflashctl.commands import generate as generate_cmd

    opts = generate_cmd.GenerateOptions(target_model=target_model, prompts=prompts, out=out_dir,
                                        extra=list(extra or []), server=server, thinking=thinking, name=name,
                                        source=source, kill_zombies=kill_zombies, confirm=not wait)
    with open_target(hosts, host) as target:
        with _launch_errors(target, json_out):
            job = generate_cmd.start(target, opts, say=_say(json_out))
        res, code = job.run, 0
        if wait:
            job.wait = _wait_job(target, res.run_id, timeout, json_out)
            code = job.wait.exit_code
            if not json_out:
                _say_wait("exit", job.wait, timeout)
        elif not json_out:
            out(f"generating into {job.out} as run [bold]{escape(res.run_id)}[/] on {target.host.label}")
            out(f"  log  {res.log_path}\n  next dflashctl logs -f {res.run_id} | dflashctl status | "
                f"dflashctl stop {res.run_id}", markup=False, soft_wrap=True)
        if json_out:
            print_json(job.to_record())
        raise Exit(code)


def _wait_job(target: Target, run_id: str, timeout: float | None, json_out: bool,
              ok_codes: tuple[int, ...] = (0,)) -> waiting.WaitResult:
    """Wait for a job run (eval, generate) to end, its log streamed to stderr; Ctrl-C detaches (exit 0). A job
    that ended with another code than ok_codes is reported as a failed launch (waiting.failure)."""
    from dflashctl.commands import waiting

    echo = None if json_out else (lambda b: (sys.stderr.buffer.write(b), sys.stderr.flush()))
    try:
        with _launch_errors(target, json_out):
            result = waiting.wait(target, run_id, "exit", timeout, on_log=echo)
            if result.died_early(ok_codes):
                raise result.failure()
        return result
    except KeyboardInterrupt:
        err(f"\ndetached; run {run_id} keeps running (stop it with `dflashctl stop {run_id}`)")
        raise Exit(0) from None


@contextmanager
def _launch_errors(target: Target, json_out: bool) -> Iterator[None]:
    """What a refused or failed launch shows besides its one-line error: the processes in the way, or the first
    lines of the run's log (a JSON document with them under --json)."""
    from dflashctl.commands import launch as launch_cmd
    from dflashctl.commands import waiting

    try:
        yield
    except launch_cmd.LaunchRefused as e:
        if e.rows and not json_out:
            from dflashctl.cli.runs import zombie_table

            show(zombie_table(e.rows, outcome=False), to_stderr=True)
        raise
    except waiting.LaunchFailed as e:
        if json_out:
            print_json(e.to_record(target.host.name))
        elif e.log_head:
            err("[bold]first lines of the log:[/]")
            err(e.log_head, markup=False, highlight=False)
        raise


def _say_wait(what: str, r: waiting.WaitResult, timeout: float | None) -> None:
    if r.reached and what == "step":
        out(f"first step after {r.waited_s:.0f}s: {r.line}", markup=False)
    elif r.reached:
        out(f"run ended after {r.waited_s:.0f}s: {r.run.verdict()} (exit code {r.run.exit_code})")
    elif r.run.alive:
        out(f"still running after {timeout:g}s without a step= line; the run keeps going (exit 101)")
    else:
        out(f"run ended before its first step: {r.run.verdict()} (exit code {r.run.exit_code}); "
            f"see `dflashctl logs --errors {r.run.id}`")


@app.command("adopt")
def adopt(
    pid: int = typer.Option(..., "--pid", metavar="PID", help="the process to adopt, as the container sees it"),
    log: str = typer.Option(..., "--log", metavar="PATH",
                            help="the file it writes its output to, in the container (relative: to its cwd)"),
    name: str | None = typer.Option(None, "--name", "-n", help="run name (default: its script's name)"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Make a process started by hand the current run: status, logs, stop and kill-zombies then treat it as one."""
    import shlex

    from dflashctl.commands import adopt as adopt_cmd

    with open_target(hosts, host) as target:
        res = adopt_cmd.adopt(target, pid, log, name)
    if json_out:
        print_json(res.to_record())
        return
    out(f"adopted pid {res.pid} as run [bold]{escape(res.run_id)}[/] on {target.host.label}")
    out(f"  found    {res.found}", markup=False)
    out(f"  command  {shlex.join(res.cmdline)}\n  started  {res.started_at}\n  log      {res.log_path}"
        f"\n  stop     ends its whole process tree ({len(res.tree) + 1} process(es) now, found again at stop time)",
        markup=False)
    out(f"  next dflashctl status | dflashctl logs -f {res.run_id} | dflashctl stop {res.run_id}", markup=False)
