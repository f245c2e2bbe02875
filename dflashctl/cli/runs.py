"""CLI verbs of the run lifecycle: deploy, launch, runs, logs, stop, kill-zombies.

Each verb parses, calls one function in commands/, renders, and raises common.Exit with the
documented code (DESIGN §5). Errors are DflashError: one line at the boundary, never a traceback.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from dflashctl.cli import app
from dflashctl.cli.common import Exit, HostOpt, HostsOpt, JsonOpt, age, console, err_console, print_json
from dflashctl.errors import ConfigError, ExitCode
from dflashctl.remote import Target, connect

if TYPE_CHECKING:  # each verb imports its command module itself: `status` should not pay for `deploy`
    from dflashctl.commands import launch as launch_cmd
    from dflashctl.commands import logs as logs_cmd
    from dflashctl.commands import zombies as zombies_cmd

_out = partial(console.print, soft_wrap=True)  # plain lines: never re-wrapped at 80 columns when piped
_err = partial(err_console.print, soft_wrap=True)

SourceOpt = typer.Option(None, "--source", metavar="DIR",
                         help="code to deploy when the container's is stale: any directory (default: the host's "
                              "code_source, else the trainer installed with dflashctl)")
KillZombiesOpt = typer.Option(False, "--kill-zombies", help="end processes of earlier runs first")


@contextmanager
def _target(hosts: Path | None, host: str | None):
    from dflashctl.config import load_inventory

    target = connect(load_inventory(hosts).get(host))
    try:
        yield target
    finally:
        target.close()


def _where(target: Target) -> str:
    return target.host.label


def _show(renderable: object, *, err: bool = False) -> None:
    """Tables keep whole run ids when piped: rich would squeeze them into 80 columns."""
    c = err_console if err else console
    if c.is_terminal:
        c.print(renderable)
        return
    saved = c.width
    c.width = 240
    try:
        c.print(renderable)
    finally:
        c.width = saved


# ---------------------------------------------------------------------------------------------- deploy


@app.command("deploy")
def deploy(
    check: bool = typer.Option(False, "--check", help="only say whether the deployed code matches (exit 1 if not)"),
    force: bool = typer.Option(False, "--force", help="send the tree even when the hashes match"),
    source: Path | None = typer.Option(
        None, "--source", metavar="DIR",
        help="the directory to ship: its files land in <workspace>/code/ (a `trainer` package: in code/trainer/); "
             "default: the host's code_source, else the trainer installed with dflashctl"),
    max_file_mib: float | None = typer.Option(None, "--max-file-mib", metavar="MIB", min=0.001,
                                              help="refuse a file bigger than this (default: code_max_file_mib, 50)"),
    max_total_mib: float | None = typer.Option(None, "--max-total-mib", metavar="MIB", min=0.001,
                                               help="refuse a tree bigger in all (default: code_max_total_mib, 200)"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Ship a directory (yours, or our trainer/) into <workspace>/code (atomic swap; nothing sent when unchanged)."""
    from dflashctl.commands import deploy as deploy_cmd

    with _target(hosts, host) as target:
        limits = deploy_cmd.Limits.of(target.host, max_file_mib, max_total_mib)
        if check:
            st = deploy_cmd.check(target, source, limits=limits)
            if json_out:
                print_json({"host": target.host.name, "current": st.current, "local_hash": st.local_hash,
                            "remote_hash": st.remote_hash, "recorded_hash": st.recorded_hash, "path": st.remote_path,
                            "source": str(st.source.path) if st.source else None, "files": st.files})
            elif st.current:
                _out(f"code on {_where(target)} is current ({st.local_hash[:12]})")
            elif st.remote_hash is None:
                _out(f"no code deployed on {_where(target)} (local {st.local_hash[:12]})")
            elif st.remote_hash == st.local_hash:
                _out(f"code on {_where(target)} is stale: same files, but recorded as "
                     f"{(st.recorded_hash or 'nothing')[:12]} (an older deploy); `dflashctl deploy` rewrites it")
            else:
                edited = " (edited in place)" if st.recorded_hash == st.local_hash else ""
                _out(f"code on {_where(target)} is stale{edited}: deployed {st.remote_hash[:12]}, "
                              f"local {st.local_hash[:12]}")
            raise Exit(0 if st.current else 1)
        res = deploy_cmd.deploy(target, source, force=force, limits=limits)
        if json_out:
            print_json({"host": target.host.name, "changed": res.changed, "hash": res.hash, "files": res.files,
                        "bytes_sent": res.bytes_sent, "path": res.path, "seconds": round(res.seconds, 3),
                        "source": str(res.source.path) if res.source else None})
        elif res.changed:
            label = res.source.label if res.source else "trainer"
            _out(f"deployed {label} {res.hash[:12]} ({res.files} files, {res.bytes_sent / 1024:.1f} KiB) "
                          f"to {_where(target)}:{res.path} in {res.seconds:.1f}s", markup=False)
        else:
            _out(f"code on {_where(target)} is current ({res.hash[:12]}); nothing sent")


# ---------------------------------------------------------------------------------------------- launch


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
    resume_from: str | None = typer.Option(None, "--resume-from", metavar="RUN",
                                           help="continue an ended run (id or latest) from its newest checkpoint, "
                                                "in a new run directory, with its config unless --config"),
    wait_for: str = typer.Option("started", "--wait-for", metavar="started|step|exit",
                                 help="return once the run has started, printed its first training step, or ended"),
    timeout: float | None = typer.Option(None, "--timeout", metavar="S",
                                         help="give up waiting after S seconds (exit 101; the run keeps going)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="stream the log until the run ends (Ctrl-C detaches)"),
    source: Path | None = SourceOpt,
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Start a run detached in the container, with its own run directory: the bundled trainer, or any command."""
    if wait_for not in ("started", "step", "exit"):
        raise ConfigError(f"--wait-for must be started, step or exit (got {wait_for!r})")
    from dflashctl.commands import launch as launch_cmd

    words = list(extra or [])
    opts = launch_cmd.LaunchOptions(name=name, config=config, kill_zombies=kill_zombies,
                                    extra=[] if exec_ else words, command=words if exec_ else None, shell=shell,
                                    env=launch_cmd.parse_env(list(env or [])), host_command=True,
                                    source=source, resume_from=resume_from,
                                    confirm=wait_for == "started" and not follow)
    say = (lambda m: _err(f"[dim]{escape(m)}[/]")) if not json_out else (lambda m: None)
    with _target(hosts, host) as target:
        with _launch_errors(target, json_out):
            res = launch_cmd.launch(target, opts, say=say)
        doc = {"host": target.host.name, "run_id": res.run_id, "run_dir": res.run_dir, "pid": res.pid,
               "log": res.log_path, "name": res.name, "config": res.config, "notes": res.notes,
               "resumed_from": res.resumed_from}
        if not json_out:
            _out(f"launched run [bold]{res.run_id}[/] on {_where(target)}")
            _out(f"  pid  {res.pid}\n  log  {res.log_path}", markup=False)
            _out(f"  next dflashctl status | dflashctl logs -f {res.run_id} | dflashctl stop {res.run_id}",
                          markup=False, soft_wrap=True)
        code = 0
        if follow:
            code = _follow(target, res.run_id, from_start=True)
        elif wait_for != "started":
            with _launch_errors(target, json_out):
                result = launch_cmd.wait(target, res.run_id, wait_for, timeout)  # type: ignore[arg-type]
                if result.died_early():
                    raise result.failure()
            code = result.exit_code
            doc["wait"] = {"for": wait_for, "reached": result.reached, "verdict": str(result.run.verdict()),
                           "exit_code": result.run.exit_code, "line": result.line,
                           "waited_s": round(result.waited_s, 1)}
            if not json_out:
                _say_wait(wait_for, result, timeout)
        if json_out:
            print_json(doc)
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
    timeout: float | None = typer.Option(None, "--timeout", metavar="S",
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
    say = (lambda m: _err(f"[dim]{escape(m)}[/]")) if not json_out else (lambda m: None)
    with _target(hosts, host) as target:
        with _launch_errors(target, json_out):
            res, src = eval_cmd.start(target, opts, say=say)
        doc: dict = {"host": target.host.name, "run_id": res.run_id, "run_dir": res.run_dir, "evaluated": src.id}
        say(f"evaluating as run {res.run_id} (log {res.log_path})")
        if not wait:
            if json_out:
                print_json(doc)
            else:
                _out(res.run_id, markup=False)
            raise Exit(0)
        result = _wait_job(target, res.run_id, timeout, json_out, ok_codes=(0, 1))
        code = result.exit_code
        if result.reached and result.run.exit_code in (0, 1):  # 1: it ran, but the lossless check failed
            report = eval_cmd.report(target, res.run_dir)
            doc["report"] = report
            if not json_out:
                _out(f"τ {report['tau']:.3f} (block {report['block_size']}) · tokens per target forward "
                     f"{report['tokens_per_forward']:.3f} · lossless {report['lossless_count']}/"
                     f"{report['num_prompts']} · {'untrained (step 0)' if report.get('untrained') else 'trained'} "
                     f"drafter of run {src.id} · report {res.run_dir}/{eval_cmd.REPORT}", markup=False)
        elif not json_out:
            _say_wait("exit", result, timeout)
        if json_out:
            doc["wait"] = _wait_record(result)
            print_json(doc)
        raise Exit(code)


@app.command("generate")
def generate(
    extra: list[str] | None = typer.Argument(None, metavar="[-- GENERATE_ARGS...]",
                                             help="more `trainer.data generate` arguments: --limit N, --sample, "
                                                  "--max-new-tokens N, --devices cuda:0,cuda:1 …"),
    target_model: str = typer.Option(..., "--target", "-t", metavar="CKPT",
                                     help="Hugging Face checkpoint directory in the container (Qwen3 / Llama)"),
    prompts: str = typer.Option(..., "--prompts", "-p", metavar="PATH",
                                help="prompt JSONL in the container (relative to <workspace>/code, or absolute)"),
    out: str = typer.Option(..., "--out", "-o", metavar="DIR",
                            help="data directory to write in the container; the same command again resumes it"),
    name: str | None = typer.Option(None, "--name", "-n", help="run name (default: datagen-<out dir name>)"),
    wait: bool = typer.Option(False, "--wait", help="stream the log until it ends (else return once it runs)"),
    timeout: float | None = typer.Option(None, "--timeout", metavar="S",
                                         help="with --wait: give up after S seconds (exit 101; it goes on)"),
    kill_zombies: bool = KillZombiesOpt,
    source: Path | None = SourceOpt,
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Let the target answer a prompt set (training data), in the container, as a run of its own."""
    from dflashctl.commands import generate as generate_cmd

    opts = generate_cmd.GenerateOptions(target_model=target_model, prompts=prompts, out=out, extra=list(extra or []),
                                        name=name, source=source, kill_zombies=kill_zombies, confirm=not wait)
    say = (lambda m: _err(f"[dim]{escape(m)}[/]")) if not json_out else (lambda m: None)
    with _target(hosts, host) as target:
        with _launch_errors(target, json_out):
            res = generate_cmd.start(target, opts, say=say)
        doc: dict = {"host": target.host.name, "run_id": res.run_id, "run_dir": res.run_dir, "log": res.log_path,
                     "out": out}
        code = 0
        if wait:
            result = _wait_job(target, res.run_id, timeout, json_out)
            code = result.exit_code
            doc["wait"] = _wait_record(result)
            if not json_out:
                _say_wait("exit", result, timeout)
        elif not json_out:
            _out(f"generating into {out} as run [bold]{escape(res.run_id)}[/] on {_where(target)}")
            _out(f"  log  {res.log_path}\n  next dflashctl logs -f {res.run_id} | dflashctl status | "
                 f"dflashctl stop {res.run_id}", markup=False, soft_wrap=True)
        if json_out:
            print_json(doc)
        raise Exit(code)


def _wait_job(target: Target, run_id: str, timeout: float | None, json_out: bool,
              ok_codes: tuple[int, ...] = (0,)) -> launch_cmd.WaitResult:
    """Wait for a job run (eval, generate) to end, its log streamed to stderr; Ctrl-C detaches (exit 0). A job
    that ended with another code than ok_codes is reported as a failed launch (launch_cmd.failure)."""
    from dflashctl.commands import launch as launch_cmd

    echo = None if json_out else (lambda b: (sys.stderr.buffer.write(b), sys.stderr.flush()))
    try:
        with _launch_errors(target, json_out):
            result = launch_cmd.wait(target, run_id, "exit", timeout, on_log=echo)
            if result.died_early(ok_codes):
                raise result.failure()
        return result
    except KeyboardInterrupt:
        _err(f"\ndetached; run {run_id} keeps running (stop it with `dflashctl stop {run_id}`)")
        raise Exit(0) from None


def _wait_record(result: launch_cmd.WaitResult) -> dict:
    return {"reached": result.reached, "verdict": str(result.run.verdict()), "exit_code": result.run.exit_code,
            "waited_s": round(result.waited_s, 1)}


@contextmanager
def _launch_errors(target: Target, json_out: bool):
    """What a refused or failed launch shows besides its one-line error: the processes in the way, or the first
    lines of the run's log (a JSON document with them under --json)."""
    from dflashctl.commands import launch as launch_cmd

    try:
        yield
    except launch_cmd.LaunchRefused as e:
        if e.rows and not json_out:
            _show(_zombie_table(e.rows, outcome=False), err=True)
        raise
    except launch_cmd.LaunchFailed as e:
        if json_out:
            print_json({"host": target.host.name, "run_id": e.run_id, "launched": False, "error": e.message,
                        "exit_code": e.run_exit_code, "log_head": e.log_head})
        elif e.log_head:
            _err("[bold]first lines of the log:[/]")
            _err(e.log_head, markup=False, highlight=False)
        raise


def _say_wait(what: str, r: launch_cmd.WaitResult, timeout: float | None) -> None:
    if r.reached and what == "step":
        _out(f"first step after {r.waited_s:.0f}s: {r.line}", markup=False)
    elif r.reached:
        _out(f"run ended after {r.waited_s:.0f}s: {r.run.verdict()} (exit code {r.run.exit_code})")
    elif r.run.alive:
        _out(f"still running after {timeout:g}s without a step= line; the run keeps going "
                      f"(exit 101)")
    else:
        _out(f"run ended before its first step: {r.run.verdict()} (exit code {r.run.exit_code}); "
                      f"see `dflashctl logs --errors {r.run.id}`")


def _follow(target: Target, run: str | None, *, from_start: bool = False, lines: int = 10) -> int:
    from dflashctl.commands import logs as logs_cmd

    info = None
    try:
        for ev in logs_cmd.follow(target, run, from_start=from_start, lines=lines):
            info = ev.run
            if ev.rotated:
                _err("[dim]-- log rotated; reading from its start --[/]")
            if ev.data:
                sys.stdout.buffer.write(ev.data)
                sys.stdout.flush()
    except KeyboardInterrupt:
        if info is not None:
            _err(f"\ndetached; run {info.id} keeps running (stop it with `dflashctl stop {info.id}`)")
        return 0
    if info is None:
        return 0
    verdict = info.verdict()
    _err(f"-- run {info.id} ended: {verdict} (exit code {info.exit_code}) --")
    return int(verdict.exit_code)


# ---------------------------------------------------------------------------------------------- adopt


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
    from dflashctl.commands import adopt as adopt_cmd

    with _target(hosts, host) as target:
        res = adopt_cmd.adopt(target, pid, log, name)
    if json_out:
        print_json({"host": target.host.name, "run_id": res.run_id, "run_dir": res.run_dir, "pid": res.pid,
                    "log": res.log_path, "name": res.name, "cmdline": res.cmdline, "cwd": res.cwd,
                    "started_at": res.started_at, "leads_group": res.leads_group})
        return
    import shlex

    _out(f"adopted pid {res.pid} as run [bold]{escape(res.run_id)}[/] on {_where(target)}")
    _out(f"  command  {shlex.join(res.cmdline)}\n  started  {res.started_at}\n  log      {res.log_path}"
         f"\n  stop     {'its process group' if res.leads_group else 'the pid alone (it leads no process group)'}",
         markup=False)
    _out(f"  next dflashctl status | dflashctl logs -f {res.run_id} | dflashctl stop {res.run_id}", markup=False)


# ---------------------------------------------------------------------------------------------- runs


@app.command("runs")
def runs(host: str | None = HostOpt, hosts: Path | None = HostsOpt, json_out: bool = JsonOpt) -> None:
    """Every run on the host with its verdict, start, duration and last step; newest first."""
    from dflashctl.commands import runs as runs_cmd

    with _target(hosts, host) as target:
        lst = runs_cmd.list_runs(target)
    if json_out:
        print_json({"host": lst.host, "workspace": lst.workspace, "latest": lst.latest,
                    "runs": [r.to_json(lst.now) for r in lst.runs]})
        return
    if not lst.runs:
        _out(f"no runs in {lst.workspace}/runs on {lst.host}")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("", "RUN", "VERDICT", "PID", "STARTED", "DURATION", "STEP", "EXIT"):
        table.add_column(col, no_wrap=True)
    for r in lst.runs:
        started = (r.meta or {}).get("started_at") or "-"
        table.add_row("*" if r.id == lst.latest else "", r.id, str(r.verdict(lst.now)), str(r.pid or "-"),
                      str(started), age(r.duration_s(lst.now)), "-" if r.last_step is None else str(r.last_step),
                      "-" if r.exit_code is None else str(r.exit_code))
    _show(table)
    _out("* = runs/latest")


# ---------------------------------------------------------------------------------------------- logs


@app.command("logs")
def logs(
    run: str | None = typer.Argument(None, metavar="[RUN]", help="run id (default: the latest run)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing as the log grows (Ctrl-C detaches)"),
    lines: int = typer.Option(50, "--lines", "-n", metavar="N", help="lines from the end to print first"),
    errors: bool = typer.Option(False, "--errors",
                                help="only whole tracebacks of crashed threads and ranks + final exception"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Print a run's train.log (its tail, a live follow, or only its errors)."""
    if lines < 0:
        raise ConfigError(f"--lines must be 0 or more (got {lines})")
    from dflashctl.commands import logs as logs_cmd

    with _target(hosts, host) as target:
        if errors:
            _print_errors(logs_cmd.errors(target, run), json_out)
            return
        if follow:
            raise Exit(_follow(target, run, lines=lines))
        t = logs_cmd.tail(target, run, lines)
        if json_out:
            print_json({"run": t.run.id, "path": t.run.log_path, "text": t.text, "truncated": t.truncated})
            return
        sys.stdout.write(t.text)
        sys.stdout.flush()


def _print_errors(v: logs_cmd.ErrorsView, json_out: bool) -> None:
    in_log = {tb.thread for tb in v.tracebacks}
    files_only = {k: d for k, d in v.error_files.items() if k not in in_log}
    if json_out:
        print_json({"run": v.run.id, "final_exception": v.final_exception,
                    "tracebacks": [{"thread": tb.thread, "rank": tb.rank, "first_line": tb.first_line,
                                    "last_line": tb.last_line, "exception": tb.exc_line, "text": tb.text}
                                   for tb in v.tracebacks],
                    "workers": [{"name": f.name, "line": f.line, "exit_code": f.exit_code, "how": f.how}
                                for f in v.workers.values()],
                    "root_cause": v.root_cause, "error_files": v.error_files})
        return
    if not v.tracebacks and not v.error_files and not v.workers:
        _out(f"no tracebacks in {v.run.log_path}")
        return
    if v.scanned_from:
        _out(f"[dim](scanned the last part of the log, from byte {v.scanned_from})[/]")
    for tb in v.tracebacks:
        who = escape(tb.thread if tb.rank is not None else f"thread {tb.thread}" if tb.thread else "main thread")
        _out(f"[bold red]── {who}[/] [dim](log lines {tb.first_line}-{tb.last_line})[/]")
        _out(tb.text.rstrip("\n"), markup=False, highlight=False)
    for thread, doc in files_only.items():
        _out(f"[bold red]── thread {escape(thread)}[/] [dim](errors/{escape(thread)}.json)[/]")
        text = doc.get("traceback") or f"{doc.get('type')}: {doc.get('message')}"
        _out(str(text).rstrip("\n"), markup=False, highlight=False)
    for f in v.workers.values():
        _out(f"[bold red]── {escape(f.name)}[/] [dim](log line {f.line})[/] {escape(f.how)}")
        if f.exit_code is not None:
            _out(f"  {f.text}", markup=False, highlight=False)
    if v.root_cause and len({tb.thread for tb in v.tracebacks if tb.thread} | set(v.workers)) > 1:
        _out(f"[bold]first to fail:[/] {escape(v.root_cause)}")
    if v.final_exception:
        _out(f"[bold]final exception:[/] {escape(v.final_exception)}")


# ---------------------------------------------------------------------------------------------- stop


@app.command("stop")
def stop(
    run: str | None = typer.Argument(None, metavar="[RUN]", help="run id (default: the latest run)"),
    grace: float = typer.Option(30.0, "--grace", metavar="S", help="seconds between SIGTERM and SIGKILL"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Stop a run: SIGTERM to its process group, grace period, SIGKILL. Exits 103 (stopped by user)."""
    from dflashctl.commands import stop as stop_cmd

    with _target(hosts, host) as target:
        res = stop_cmd.stop(target, run, grace_s=grace)
    if json_out:
        print_json({"run": res.run_id, "pid": res.pid, "exit_code": res.exit_code, "escalated": res.escalated,
                    "recorded_by": res.recorded_by, "gpu_released_mib": res.gpu_released_mib})
    else:
        how = "SIGKILL after the grace period" if res.escalated else "SIGTERM"
        _out(f"stopped run {res.run_id} (pid {res.pid}) with {how}: exit code {res.exit_code}")
        if res.gpu_released_mib:
            freed = ", ".join(f"GPU {i}: {mib:.0f} MiB" for i, mib in res.gpu_released_mib.items() if mib)
            _out(f"GPU memory released: {freed or 'none'}")
    raise Exit(ExitCode.STOPPED)


# ---------------------------------------------------------------------------------------------- kill-zombies


def _short_cmd(cmdline: str, width: int = 70) -> str:
    """The command as a person reads it: program base name, then its arguments."""
    prog, _, rest = cmdline.partition(" ")
    text = f"{prog.rsplit('/', 1)[-1]} {rest}".strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def _zombie_table(rows: list[zombies_cmd.ZombieRow], *, outcome: bool) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("PID", "RUN", "AGE", "GPU MiB", "STATE", "ACTION", "WHY", "COMMAND"):
        table.add_column(col, overflow="fold", no_wrap=col != "WHY")
    if outcome:
        table.add_column("OUTCOME")
    for r in rows:
        cells = [str(r.pid), escape(r.run_id or "-"), age(r.age_s), "-" if r.gpu_mib is None else f"{r.gpu_mib:.0f}",
                 r.state, r.action, escape(r.why), escape(_short_cmd(r.cmdline))]
        if outcome:
            cells.append(r.outcome or "-")
        table.add_row(*cells)
    return table


@app.command("kill-zombies")
def kill_zombies(
    dry_run: bool = typer.Option(False, "--dry-run", help="only show what would be killed"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask before killing"),
    pid: list[int] | None = typer.Option(None, "--pid", metavar="PID",
                                         help="also end this process although it has no marker (repeatable)"),
    grace: float = typer.Option(10.0, "--grace", metavar="S", help="seconds between SIGTERM and SIGKILL"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """End processes of earlier runs, defunct children's parents, and GPU holders of no live run."""
    from dflashctl.commands import zombies as zombies_cmd

    with _target(hosts, host) as target:
        found = zombies_cmd.scan(target, tuple(pid or ()))
        victims = found.to_kill
        if not json_out:
            if found.current_run:
                _out(f"current run {found.current_run} is protected")
            for note in found.notes:
                _err(f"[yellow]WARNING:[/] {escape(note)}")
            if found.rows and (dry_run or not yes or not victims):
                _show(_zombie_table(found.rows, outcome=False))
        if not victims or dry_run:
            if json_out:
                print_json({**found.to_json(), "dry_run": dry_run, "ended": 0})
            elif not victims:
                _out(f"no zombies on {_where(target)}")
            else:
                _out(f"dry run: {len(victims)} process(es) would be ended")
            return
        if not yes:
            if not sys.stdin.isatty():
                raise ConfigError(f"refusing to kill {len(victims)} process(es) without confirmation",
                                  hint="pass --yes (stdin is not a terminal), or --dry-run to look first")
            if not typer.confirm(f"end {len(victims)} process(es)?", default=False):
                raise Exit(ExitCode.USAGE)
        t0 = time.monotonic()
        report = zombies_cmd.kill(target, found, grace_s=grace)
    if json_out:
        print_json({**found.to_json(), "dry_run": False, "ended": len(report.ended), "failed": len(report.failed)})
    else:
        _show(_zombie_table(report.rows, outcome=True))
        _out(f"ended {len(report.ended)} of {len(victims)} in {time.monotonic() - t0:.1f}s")
    raise Exit(0 if not report.failed else 1)
