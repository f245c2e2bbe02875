"""What a probe is asked for: ONE typed request both sides use (stdlib only; it travels with the probe).

The laptop builds a ProbeRequest and sends `to_argv()`; the probe program reads it back with `from_argv()`. The
fields are the whole contract, so a new option is one field here, nothing else to keep in step. Field by field:

workspace    the host's workspace (runs are under <workspace>/runs); None: GPUs/processes only
run          a run id or "latest": its state and log
log_offset   the log bytes from there (at most log_max); None: the last log_max bytes
log_inode    the inode log_offset belongs to (a log rotated since is read from 0)
log_max      at most this many log bytes
procs, pids  the process scan; pids: report these too, even when nothing marks them
gpus         a GPU reading (NVML, else nvidia-smi)
events       with run: the run's events.jsonl (its last 64 KiB), newest stack capture, every rank's layout
             (heartbeats) and its flight recorder dumps as judged in the container
runs         every run's state
host_gpu_procs  a container id: run on the Proxmox host, that container's GPU compute processes
xid          the kernel log's NVRM Xid lines (where it is readable)
watch        keep running: one report per interval (and at once when the log shows a crash or the run ends)
interval, gpu_interval  the watch's pace, and how often it reads the GPUs between reports (None: once a report)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

DEFAULT_LOG_MAX = 1 << 20


@dataclass(frozen=True)
class ProbeRequest:
    workspace: str | None = None
    run: str | None = None
    log_offset: int | None = None
    log_inode: int | None = None
    log_max: int = DEFAULT_LOG_MAX
    procs: bool = False
    pids: tuple[int, ...] = field(default_factory=tuple)
    gpus: bool = False
    events: bool = False
    runs: bool = False
    host_gpu_procs: str | None = None
    xid: bool = False
    watch: bool = False
    interval: float = 1.0
    gpu_interval: float | None = None

    def to_argv(self) -> list[str]:
        """`--name value` for each field that differs from its default (`--flag` for a true bool, one `--pids`
        per pid), in field order: the same request always gives the same argv."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == _default(f):
                continue
            opt = "--" + f.name.replace("_", "-")
            if f.type == "bool":
                argv.append(opt)
            elif f.name == "pids":
                for pid in value:
                    argv += [opt, str(int(pid))]
            else:
                argv += [opt, _text(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> ProbeRequest:
        """The request to_argv wrote; ValueError naming the first argument it cannot read."""
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        pids: list[int] = []
        i = 0
        while i < len(argv):
            arg = argv[i]
            name = arg[2:].replace("-", "_") if arg.startswith("--") else ""
            if name not in kinds:
                raise ValueError(f"probe: unknown argument {arg!r}")
            kind = kinds[name]
            if kind == "bool":
                values[name] = True
                i += 1
                continue
            if i + 1 >= len(argv):
                raise ValueError(f"probe: {arg} needs a value")
            raw = argv[i + 1]
            i += 2
            try:
                if name == "pids":
                    pids.append(int(raw))
                elif "int" in kind:
                    values[name] = int(raw)
                elif "float" in kind:
                    values[name] = float(raw)
                else:
                    values[name] = raw
            except ValueError:
                what = "an integer" if "int" in kind else "a number"
                raise ValueError(f"probe: {arg} {raw!r} is not {what}") from None
        if pids:
            values["pids"] = tuple(pids)
        return cls(**values)


def _default(f):  # noqa: ANN001, ANN202 - a dataclass field; its default value
    return f.default_factory() if callable(f.default_factory) else f.default


def _text(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)
