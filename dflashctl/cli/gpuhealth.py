"""The GPU health part of the status view: each GPU's findings in its table row, and a section with what each
finding means and what to do (analysis/gpuhealth.py judges; this only draws)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from dflashctl.analysis.health import Health
from dflashctl.model import HealthSeverity

SEVERITY_STYLE = {HealthSeverity.CRITICAL: "bold red", HealthSeverity.WARNING: "yellow", HealthSeverity.INFO: "dim"}


def health_cell(health: Health, index: int) -> Text:
    """The finding ids of one GPU, worst first, for its row of the GPU table."""
    found = [f for f in health.gpu_findings if f.gpu == index]
    if not found:
        return Text("-", style="dim")
    cell = Text()
    for i, f in enumerate(found):
        cell.append(("," if i else "") + f.id, style=SEVERITY_STYLE[f.severity])
    return cell


def render_gpu_health(health: Health) -> RenderableType | None:
    """What each finding means and what to do; None when there is nothing to say."""
    if not health.gpu_findings:
        return None
    parts: list[RenderableType] = [Text("GPU health", style="bold")]
    for f in health.gpu_findings:
        line = Text("  ")
        line.append(f"GPU {f.gpu if f.gpu is not None else '?'}  ", style="bold")
        line.append(f.id, style=SEVERITY_STYLE[f.severity])
        line.append(f"  {f.meaning}" + (f" (×{f.count})" if f.count > 1 else ""))
        parts.append(line)
        parts.append(Text(f"    evidence: {f.evidence[:200]}", style="dim"))
        parts.append(Text(f"    what to do: {f.action + ': ' if f.action else ''}{f.remedy}"))
    if health.gpu_action is not None:
        parts.append(Text(f"  the GPUs need at most: {health.gpu_action}", style="bold"))
    return Group(*parts)
