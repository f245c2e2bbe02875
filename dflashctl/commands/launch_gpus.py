"""`launch --exclude-unhealthy-gpus`: the launch's GPU health pre-flight (one host, and each node of a run across
hosts before any node starts). The rule is analysis/gpuexclude.py's, the one every restart applies too: this module
only gathers what it needs (the probe's GPU readings and kernel-log Xid lines, what the run would use) and records
what a restart needs to apply it again (the launch spec's `gpu_health`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis.gpuexclude import candidate_gpus, decide, gpus_needed, report_findings
from dflashctl.errors import DflashError, ExitCode
from dflashctl.model import Host
from dflashctl.remote import probe
from dflashctl.remote.target import Target
from dflashctl.report import ProbeReport

HINT_RESET = "reset or replace them (dflashctl status shows each finding's remedy)"
HINT_CONFIGURED = ("leave them out of gpus_target/gpus_drafters in hosts.toml, or reset them (dflashctl status shows "
                   "each finding's remedy)")


class GpusRefused(DflashError):
    """Too few healthy GPUs for the run (exit 2: the user's choice of host or GPUs, nothing was started)."""

    exit_code = ExitCode.USAGE


@dataclass
class GpuPlan:
    """What the pre-flight decided: the variables for the program, the notes for the user, the spec's record."""

    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)  # launch spec `gpu_health` (sentinel/gpurecheck.py)


def configured_gpus(host: Host) -> tuple[int, ...]:
    return tuple(sorted(set(host.gpus_target) | set(host.gpus_drafters)))


def program_words(command: Sequence[str] | None, shell: str | None, runner: Sequence[str]) -> list[str]:
    """The words that say how many ranks the program starts (torchrun's --nproc-per-node): the command, the shell
    line split on blanks, or the trainer's runner."""
    if command is not None:
        return [str(a) for a in command]
    if shell is not None:
        return shell.split()
    return [str(a) for a in runner]


def plan(doc: ProbeReport, host: Host, env: dict[str, str], words: Sequence[str], *, trainer: bool) -> GpuPlan:
    """The GPUs the run would use (the host's configured ones, else CUDA_VISIBLE_DEVICES, else every GPU seen) less
    the unhealthy; GpusRefused (one line, which GPUs and why) when the run cannot do without them."""
    configured = configured_gpus(host)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    pool = candidate_gpus(doc, configured, visible)
    need = gpus_needed(words)
    fixed = trainer and bool(configured)
    ex = decide(pool, report_findings(doc), need=need, fixed=fixed)
    if ex.refused is not None:
        raise GpusRefused(ex.refused, hint=HINT_CONFIGURED if fixed else HINT_RESET)
    record = {"pool": list(pool), "need": need, "fixed": fixed, "visible": visible}
    out = GpuPlan(record=record)
    if ex.left_out:
        out.env["CUDA_VISIBLE_DEVICES"] = ex.visible()
        if not env.get("CUDA_DEVICE_ORDER"):  # CUDA's own order is fastest first: these are nvidia-smi's indices
            out.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        out.notes.append(ex.note("the program"))
    return out


def node_refusals(name: str, targets: Sequence[Target], env: dict[str, str],
                  words_of: Callable[[int], Sequence[str]]) -> GpusRefused | None:
    """A run across hosts: every node's own GPUs judged before any node starts (each leaves out its own unhealthy
    GPUs at its launch, the same rule); one refusal naming every node that could not start (`node I (HOST): why`),
    with the hint of the nodes' own refusals (configured GPUs hit: leave them out of hosts.toml); None when all can."""
    refused: list[tuple[str, str | None]] = []
    for i, t in enumerate(targets):
        doc = probe.probe_once(t, t.host.workspace, None, gpus=True, log_max=0, xid=True)
        try:
            plan(doc, t.host, env, words_of(i), trainer=True)
        except GpusRefused as e:
            refused.append((f"node {i} ({t.host.name}): {e.message}", e.hint))
    if not refused:
        return None
    hint = HINT_CONFIGURED if any(h == HINT_CONFIGURED for _, h in refused) else HINT_RESET
    return GpusRefused(f"cluster {name}: {'; '.join(m for m, _ in refused)} (nothing launched on any host)", hint=hint)
