"""eval: measure a run's drafter (acceptance length τ, real speculative decoding against its target) inside the
container, as a run of its own.

An evaluation loads the target model and can hold GPUs for minutes, so it is started like training: detached,
marked, with its own run directory and log (`trainer.eval_run`), so `status`, `logs`, `stop` and `kill-zombies`
cover it and an ssh drop leaves no orphan behind. The report comes back from `<run>/eval.json`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashctl.commands import launch as launch_cmd
from dflashctl.commands.waiting import WaitResult
from dflashctl.errors import DflashError, ExitCode
from dflashctl.remote.target import Target

MODULE = "trainer.eval_run"
REPORT = "eval.json"  # trainer/eval_run.py writes it


@dataclass
class EvalOptions:
    run: str  # the run to evaluate: id or latest
    prompts: str  # prompt JSONL or generated data dir, in the container (relative to <workspace>/code)
    untrained: bool = False  # the step-0 drafter of its config: the τ baseline
    extra: list[str] | None = None  # more trainer.eval arguments (--limit, --max-new-tokens, --device …)
    source: Path | None = None
    kill_zombies: bool = False
    confirm: bool = True  # False: the caller wait()s for the end (launch_cmd.LaunchOptions.confirm)


@dataclass
class EvalJob:
    """An evaluation run and the training run it evaluates; the caller adds the wait and the report once it has them.
    Both the text and `eval --json` are drawn from it."""

    run: launch_cmd.LaunchResult
    evaluates: launch_cmd.EndedRun
    wait: WaitResult | None = None
    report: dict[str, Any] | None = None  # eval.json, once the run wrote it

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"host": self.run.host, "run_id": self.run.run_id, "run_dir": self.run.run_dir,
                               "evaluated": self.evaluates.id}
        if self.report is not None:
            rec["report"] = self.report
        if self.wait is not None:
            rec["wait"] = self.wait.to_record(job=True)
        return rec


def start(target: Target, opts: EvalOptions, *, say: Callable[[str], None] = lambda _m: None) -> EvalJob:
    """Start the evaluation run; returns it with the training run it evaluates."""
    src = launch_cmd.ended_run(target, opts.run, "evaluate it")
    checkpoint = [] if opts.untrained else ["--checkpoint", src.dir]
    return EvalJob(launch_cmd.launch(target, launch_cmd.LaunchOptions(
        name=f"eval-{src.name}", module=MODULE, container_config=src.config_path, source=opts.source,
        kill_zombies=opts.kill_zombies, confirm=opts.confirm,
        meta={"kind": "eval", "evaluates": src.id, "untrained": opts.untrained, "job": f"evaluating run {src.id}"},
        extra=[*checkpoint, "--prompts", opts.prompts, *(opts.extra or [])],
    ), say=say), src)


def report(target: Target, run_dir: str) -> dict[str, Any]:
    """The evaluation's JSON report; DflashError (100) when the run wrote none (it failed: see its log)."""
    res = target.run(["cat", f"{run_dir}/{REPORT}"], timeout=60)
    try:
        doc = json.loads(res.stdout) if res.ok else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise DflashError(f"the evaluation wrote no report ({run_dir}/{REPORT})", exit_code=ExitCode.CRASHED,
                          hint=f"see its log: dflashctl logs {run_dir.rstrip('/').rsplit('/', 1)[-1]}")
    return doc
