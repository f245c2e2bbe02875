"""generate: the target answers a prompt set inside the container (`trainer.data generate`), as a run of its own.

Data generation holds the target's GPUs for as long as the target takes to answer every prompt, so it is started
like training: detached, marked, logged (`trainer.datagen_run`), so `status`, `logs -f`, `stop` and `kill-zombies`
cover it. The same command again resumes at the first missing shard. With `server` the prompts go to an
OpenAI-compatible server of the target (SGLang, vLLM: `trainer.data generate --server URL`), reachable from the
container; the checkpoint directory is then read for its tokenizer only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dflashctl.commands import launch as launch_cmd
from dflashctl.commands.program import run_slug
from dflashctl.commands.waiting import WaitResult
from dflashctl.errors import ConfigError
from dflashctl.remote.target import Target

MODULE = "trainer.datagen_run"
# generation needs no trainer config; the launcher's convention wants one, so the run records this
CONFIG = "# dflashctl generate: trainer.data generate needs no trainer config; its arguments are in meta.json argv\n"


@dataclass
class GenerateOptions:
    target_model: str  # a Hugging Face checkpoint directory in the container
    prompts: str  # prompt JSONL in the container (relative to <workspace>/code, or absolute)
    out: str  # the data directory to write (or resume), in the container
    extra: list[str] | None = None  # more `trainer.data generate` arguments: --limit, --sample, --devices …
    server: str | None = None  # an OpenAI-compatible server's URL, as the container reaches it (--server)
    thinking: str | None = None  # "on" / "off": the chat template's enable_thinking; None: the model's default
    name: str | None = None
    source: Path | None = None
    kill_zombies: bool = False
    confirm: bool = True  # False: the caller wait()s for the end (launch_cmd.LaunchOptions.confirm)


@dataclass
class GenerateJob:
    """A data generation run and where it writes; the caller adds the wait. The text and `generate --json` alike."""

    run: launch_cmd.LaunchResult
    out: str  # the data directory, in the container
    wait: WaitResult | None = None

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"host": self.run.host, "run_id": self.run.run_id, "run_dir": self.run.run_dir,
                               "log": self.run.log_path, "out": self.out}
        if self.wait is not None:
            rec["wait"] = self.wait.to_record(job=True)
        return rec


def trainer_args(opts: GenerateOptions) -> list[str]:
    """The `trainer.data generate` arguments of a generate run (after the launcher's --config/--run-dir)."""
    for flag, value in (("--target", opts.target_model), ("--prompts", opts.prompts), ("--out", opts.out)):
        if not value.strip():
            raise ConfigError(f"{flag} is empty", hint="give a path in the container")
    if opts.server is not None and not opts.server.strip():
        raise ConfigError("--server is empty", hint="give the server's URL as the container reaches it, "
                                                    "e.g. http://127.0.0.1:30000")
    if opts.thinking not in (None, "on", "off"):
        raise ConfigError(f"--thinking must be on or off, not {opts.thinking!r}",
                          hint="leave it out for the model's default")
    args = ["--target", opts.target_model, "--prompts", opts.prompts, "--out", opts.out]
    args += ["--server", opts.server.strip()] if opts.server is not None else []
    args += ["--thinking", opts.thinking] if opts.thinking is not None else []
    return [*args, *(opts.extra or [])]


def start(target: Target, opts: GenerateOptions, *, say: Callable[[str], None] = lambda _m: None) -> GenerateJob:
    extra = trainer_args(opts)
    name = opts.name or f"datagen-{run_slug(PurePosixPath(opts.out.rstrip('/')).name or 'data')}"
    return GenerateJob(launch_cmd.launch(target, launch_cmd.LaunchOptions(
        name=name, module=MODULE, config_text=CONFIG, source=opts.source, kill_zombies=opts.kill_zombies,
        confirm=opts.confirm,
        meta={"kind": "generate", "job": f"generating data into {opts.out}", "out": opts.out},
        extra=extra,
    ), say=say), opts.out)
