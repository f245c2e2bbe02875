"""What a launch starts, decided on this side before anything is contacted: the program (the bundled trainer, `--exec`,
`--shell`, the host's `command`), the run's name and id slug, its `--env`, its config file and the local commit.

Split out of launch.py so that every usage error (exit 2) of a launch lives in one short module, and so that adopt and
generate can name runs without importing the whole launch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl.agent.lib.procfs import MARKER, RUN_DIR_VAR
from dflashctl.commands.sentinel import WatchOptions
from dflashctl.errors import ConfigError
from dflashctl.model import Host

DEFAULT_CONFIG = "trainer/configs/tiny-cpu.toml"  # relative to <workspace>/code
NAME_MAX = 40
RUN_VARIABLES = (MARKER, RUN_DIR_VAR)  # set by the launcher for every process of a run
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class LaunchOptions:
    name: str | None = None
    config: Path | None = None  # a local file, uploaded as <run-dir>/config.toml
    kill_zombies: bool = False
    extra: list[str] = field(default_factory=list)  # passed to the trainer after its own arguments
    source: Path | None = None  # the trainer tree to deploy when the container's is stale
    module: str = "trainer"  # `python -m MODULE` in <workspace>/code
    confirm_s: float | None = None  # how long confirm() may take (None: launch.CONFIRM_S)
    confirm: bool = True  # False: return once it is started; the caller wait()s (one report, no window)
    resume_from: str | None = None  # a run id (or "latest"): start from its newest checkpoint, in a new run dir
    container_config: str | None = None  # a config path in the container (a run's config.toml); --config wins
    config_text: str | None = None  # the config itself (a job that needs none records what it is instead)
    meta: dict[str, object] = field(default_factory=dict)  # more meta.json fields (kind, job, evaluates …)
    command: list[str] | None = None  # --exec: this argv instead of the bundled trainer (no shell), in <workspace>/code
    shell: str | None = None  # --shell: `bash -c SHELL` (`sh -c` where there is no bash) instead
    env: dict[str, str] = field(default_factory=dict)  # --env: more variables for the program (parse_env)
    host_command: bool = False  # neither given: the host's `command` (hosts.toml) with `extra` appended, if it has one
    watch: WatchOptions = field(default_factory=WatchOptions)  # the run's sentinel: notify, failure policy, restarts
    run_id: str | None = None  # this exact run id (a cluster's later nodes take the first node's); refused if taken
    runner: list[str] = field(default_factory=list)  # after python, before `-m MODULE`: `-m torch.distributed.run …`
    exclude_unhealthy_gpus: bool = False  # leave out GPUs with critical health findings (analysis/gpuexclude.py)



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


def read_config(opts: LaunchOptions, host_config: str | None) -> tuple[str | None, str]:
    """(text to upload, label): the inline text, the local --config file's, or (None, a path in the container)."""
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


def git_sha(source: Path) -> str | None:
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
