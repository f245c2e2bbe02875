"""GPU health judged per GPU: ECC, row remapping, the driver's recovery advice, clock slowdowns, persistence mode and
the kernel log's Xids. Pure: the probe's model.GpuReport and Xid events in, model.GpuHealth / HealthFinding out.

`gpu_health` reads the two shapes analysis/gpus.py reads: the probe's NVML dicts (a field the driver does not support
arrives as None) and nvidia-smi `--query-gpu` CSV with its header (`[N/A]`, `[Not Supported]` → None, `Enabled` /
`Yes` → True, `0x…` bitmasks; `clocks_throttle_reasons.*` is what drivers before R535 call `clocks_event_reasons.*`);
and saved `nvidia-smi -q` text (source "nvidia-smi-q": analysis/smiq.py reads it, and holds the clock-event bits).
Nothing is guessed: a field missing from an older driver or probe stays None and yields no finding.
`health_findings` turns readings and Xids into findings with stable ids (FINDINGS, and `xid-N` per XID_TABLE row).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dflashctl.analysis.gpus import PROBE_FIELDS, csv_number, csv_rows, na
from dflashctl.analysis.smiq import decode_reasons, gpu_health_from_q
from dflashctl.analysis.xids import XID_TABLE, normalize_pci, recovery_word, xid_info
from dflashctl.model import GpuAction, GpuHealth, GpuReport, HealthFinding, HealthSeverity, XidEvent

A, S = GpuAction, HealthSeverity

_THERMAL, _HW, _POWER_CAP, _POWER_BRAKE = 0x20 | 0x40, 0x8, 0x4, 0x80
_ACTION_ORDER = tuple(GpuAction)
_SEVERITY_ORDER = tuple(HealthSeverity)
_RECOVERY_ACTION = {"reset": A.RESET_GPU, "reboot": A.REBOOT, "drain": A.DRAIN_NODE}
_SMI_ALIASES = {"clocks_throttle_reasons.active": "clocks_event_reasons.active", "gpu_bus_id": "pci.bus_id"}
# nvmlDeviceGpuRecoveryAction_t: 4 is "drain P2P and reset" (draining comes first), 5 "recover IMEX domain".
_NVML_RECOVERY_CODES = {0: "none", 1: "reset", 2: "reboot", 3: "drain", 4: "drain", 5: "recover imex domain",
                        6: "reset", 7: "reboot"}


@dataclass(frozen=True)
class FindingSpec:
    """A finding id's fixed text (docs/failures.md is generated from these and XID_TABLE)."""

    id: str
    severity: HealthSeverity
    action: GpuAction | None
    meaning: str
    remedy: str


def _spec(id: str, severity: HealthSeverity, action: GpuAction | None, meaning: str,
          remedy: str) -> tuple[str, FindingSpec]:
    return id, FindingSpec(id, severity, action, meaning, remedy)


FINDINGS: dict[str, FindingSpec] = dict([
    _spec("ecc-uncorrected", S.CRITICAL, A.RESET_GPU,
          "Uncorrectable (double-bit) ECC errors since the driver loaded: GPU memory returned wrong data and the "
          "program using it was stopped.",
          "Reset the GPU (`nvidia-smi -r -i N`, or reboot) before the next run; it clears the volatile count and "
          "activates pending row remaps. Errors that come back on one GPU are a hardware fault."),
    _spec("retired-pages-pending", S.WARNING, A.RESET_GPU,
          "A memory page with ECC errors waits to be retired (GPUs before Ampere); it is retired when the driver "
          "next reloads.",
          "Reset the GPU or reboot when the run ends."),
    _spec("row-remap-pending", S.WARNING, A.RESET_GPU,
          "A memory row with ECC errors is marked for remapping; the spare row takes over at the next GPU reset. "
          "Running programs are not affected.",
          "Reset the GPU when the run ends (`nvidia-smi -r -i N`, or reboot)."),
    _spec("row-remap-failed", S.CRITICAL, A.DRAIN_NODE,
          "A row remap has failed on this GPU (a bank ran out of spare rows): it can no longer repair its memory. "
          "This is NVIDIA's RMA criterion and survives resets.",
          "Stop using the GPU (leave it out of gpus_target/gpus_drafters), run `dcgmi diag -r 3`, plan an RMA."),
    _spec("recovery-action", S.CRITICAL, None,
          "The driver says this GPU needs recovery before it can be trusted (its GPU recovery action is not None).",
          "Do what it asks (the action: reset the GPU, reboot, or drain), then start the run again; `nvidia-smi -q` "
          "shows it as GPU Recovery Action."),
    _spec("thermal-slowdown", S.WARNING, None,
          "The GPU is slowing its clocks because it is too hot (software or hardware thermal slowdown).",
          "Check cooling: fans, airflow, dust, room temperature (`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`)."),
    _spec("hw-slowdown", S.WARNING, None,
          "Hardware slowdown is engaged (clocks cut by half or more) and the driver names no thermal or power-brake "
          "cause: often the power supply.",
          "Check the GPU's power cables and the supply, then cooling; if it stays on when idle and cool, the GPU or "
          "board is faulty."),
    _spec("power-slowdown", S.WARNING, None,
          "Clocks are held down by power: the board's power brake (an external power signal: warning), or only the "
          "software power cap (the GPU is at power.limit, normal at full load: info).",
          "A power brake points at the supply or cabling. For the cap, compare power.limit with "
          "power.default_limit (`nvidia-smi -q -d POWER`): a lowered limit slows training."),
    _spec("gpu-unreadable", S.CRITICAL, None,
          "NVML could not read this GPU at all: it is lost (gone from the bus), needs a reset, or the driver went "
          "away under the probe.",
          "A lost GPU needs a reboot (reboot), one that needs a reset a GPU reset (reset the GPU); look for Xid 79 "
          "or 154 in `dmesg` on the host."),
    _spec("persistence-off", S.INFO, None,
          "Persistence mode is off: the driver unloads whenever no program holds the GPU, so each start pays its "
          "initialisation and the GPU's state resets between runs.",
          "Enable it on the host: `nvidia-smi -pm 1` (or run nvidia-persistenced)."),
])


def _int(v: object) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return None
    return int(v) if float(v).is_integer() else None


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _flag(v: object) -> bool | None:
    """NVML's yes/no: a bool, or 0/1 as the C API returns it."""
    if isinstance(v, bool):
        return v
    return bool(v) if isinstance(v, int) and v in (0, 1) else None


def _from_nvml(d: Mapping[str, object], position: int) -> GpuHealth:
    idx = _int(d.get("index"))
    rows = d.get("remapped_rows")
    rr: Mapping[str, object] = rows if isinstance(rows, Mapping) else {}
    mask = _int(d.get("clocks_event_reasons"))
    code = _int(d.get("recovery_action_code"))  # the number, where the probe sent it, says more than its word
    recovery = _NVML_RECOVERY_CODES.get(code, f"code {code}") if code is not None else \
        recovery_word(d.get("recovery_action"))
    listed = d.get("unsupported")
    unsupported = tuple(u for u in listed if isinstance(u, str)) if isinstance(listed, (list, tuple)) else ()

    def text(key: str) -> str | None:
        v = d.get(key)
        return v if isinstance(v, str) and v else None

    return GpuHealth(
        index=idx if idx is not None else position, pci_bus_id=normalize_pci(text("pci_bus_id")),
        uuid=text("uuid"), name=text("name"), temperature_c=_float(d.get("temperature_c")),
        power_w=_float(d.get("power_w")), power_limit_w=_float(d.get("power_limit_w")),
        persistence_mode=_flag(d.get("persistence_mode")),
        ecc_uncorrected_volatile=_int(d.get("ecc_uncorrected_volatile")),
        retired_pages_pending=_flag(d.get("retired_pages_pending")), remapped_rows_pending=_flag(rr.get("pending")),
        remapped_rows_failure=_flag(rr.get("failure")), remapped_rows_uncorrectable=_int(rr.get("uncorrectable")),
        remapped_rows_correctable=_int(rr.get("correctable")), recovery_action=recovery,
        clocks_event_reasons=mask, throttle_reasons=decode_reasons(mask),
        unsupported=unsupported, read_error=text("error"),
    )


def smi_rows(text: str) -> list[tuple[int, dict[str, str]]]:
    """Each data row of `--query-gpu` CSV keyed by field name (units and the older field names normalised), with its
    position in its sweep; rows that match no header (nor the probe's headerless PROBE_FIELDS) are left out."""
    out: list[tuple[int, dict[str, str]]] = []
    for _line, cells, cols, position in csv_rows(text, aliases=_SMI_ALIASES):
        names = cols if cols and len(cols) == len(cells) else PROBE_FIELDS if len(cells) == len(PROBE_FIELDS) else None
        if names is not None:
            out.append((position, dict(zip(names, cells, strict=True))))
    return out


def _smi_bool(v: str | None) -> bool | None:
    t = (na(v) or "").lower()
    return True if t in ("enabled", "yes", "true", "1") else False if t in ("disabled", "no", "false", "0") else None


def _smi_int(v: str | None) -> int | None:
    t = na(v)
    if t is not None and t.lower().startswith("0x"):
        try:
            return int(t, 16)
        except ValueError:
            return None
    return _int(csv_number(t))


def _from_smi(rec: Mapping[str, str], position: int) -> GpuHealth:
    idx = _smi_int(rec.get("index"))
    mask = _smi_int(rec.get("clocks_event_reasons.active"))
    return GpuHealth(
        index=idx if idx is not None else position, pci_bus_id=normalize_pci(na(rec.get("pci.bus_id"))),
        uuid=na(rec.get("uuid")), name=na(rec.get("name")), temperature_c=csv_number(rec.get("temperature.gpu")),
        power_w=csv_number(rec.get("power.draw")),
        power_limit_w=csv_number(rec.get("enforced.power.limit")) or csv_number(rec.get("power.limit")),
        persistence_mode=_smi_bool(rec.get("persistence_mode")),
        ecc_uncorrected_volatile=_smi_int(rec.get("ecc.errors.uncorrected.volatile.total")),
        retired_pages_pending=_smi_bool(rec.get("retired_pages.pending")),
        remapped_rows_pending=_smi_bool(rec.get("remapped_rows.pending")),
        remapped_rows_failure=_smi_bool(rec.get("remapped_rows.failure")),
        remapped_rows_uncorrectable=_smi_int(rec.get("remapped_rows.uncorrectable")),
        remapped_rows_correctable=_smi_int(rec.get("remapped_rows.correctable")),
        recovery_action=recovery_word(na(rec.get("gpu_recovery_action"))),
        clocks_event_reasons=mask, throttle_reasons=decode_reasons(mask),
        unsupported=tuple(k for k, v in rec.items() if v.strip("[] ").lower() == "not supported"),
    )


def gpu_health(report: GpuReport | None) -> list[GpuHealth]:
    """One GpuHealth per GPU index in the probe's GPU piece, by index (several CSV sweeps: the last reading wins);
    [] when it has no readings. A row or dict that cannot be read costs that GPU only."""
    by_index: dict[int, GpuHealth] = {}
    if report is not None and report.source == "nvml":
        for i, d in enumerate(report.nvml):
            if isinstance(d, Mapping):
                h = _from_nvml(d, i)
                by_index[h.index] = h
    elif report is not None and report.source == "nvidia-smi" and report.smi_csv:
        for position, rec in smi_rows(report.smi_csv):
            h = _from_smi(rec, position)
            by_index[h.index] = h
    elif report is not None and report.source == "nvidia-smi-q" and report.smi_csv:
        by_index.update((h.index, h) for h in gpu_health_from_q(report.smi_csv))
    return [by_index[i] for i in sorted(by_index)]


def pci_index(healths: Iterable[GpuHealth]) -> dict[str, int]:
    """Normalised PCI address → GPU index, for matching kernel-log Xids to the GPUs the probe saw."""
    return {h.pci_bus_id: h.index for h in healths if h.pci_bus_id}


def _finding(spec_id: str, gpu: int, evidence: str, *, severity: HealthSeverity | None = None,
             action: GpuAction | None = None) -> HealthFinding:
    spec = FINDINGS[spec_id]
    return HealthFinding(spec_id, gpu, severity or spec.severity, spec.meaning, action or spec.action, spec.remedy,
                         evidence)


def _yes(v: bool | None) -> str:
    return "yes" if v else "no"


def _gpu_findings(h: GpuHealth) -> list[HealthFinding]:
    out: list[HealthFinding] = []
    if h.read_error:
        lower = h.read_error.lower()
        action = A.REBOOT if "lost" in lower else A.RESET_GPU if "reset" in lower else None
        out.append(_finding("gpu-unreadable", h.index, f"nvml error={h.read_error}", action=action))
    if h.ecc_uncorrected_volatile:
        count = h.ecc_uncorrected_volatile
        out.append(_finding("ecc-uncorrected", h.index, f"ecc.errors.uncorrected.volatile.total={count}"))
    if h.retired_pages_pending:
        out.append(_finding("retired-pages-pending", h.index, "retired_pages.pending=yes"))
    if h.remapped_rows_pending:
        extra = f", remapped_rows.uncorrectable={h.remapped_rows_uncorrectable}" \
            if h.remapped_rows_uncorrectable is not None else ""
        out.append(_finding("row-remap-pending", h.index, "remapped_rows.pending=yes" + extra))
    if h.remapped_rows_failure:
        out.append(_finding("row-remap-failed", h.index, "remapped_rows.failure=yes"))
    if h.recovery_action not in (None, "none"):
        out.append(_finding("recovery-action", h.index, f"gpu_recovery_action={h.recovery_action}",
                            action=_RECOVERY_ACTION.get(h.recovery_action or "")))
    mask = h.clocks_event_reasons or 0
    reasons = f"clocks_event_reasons.active=0x{mask:016x} ({', '.join(h.throttle_reasons)})"
    if mask & _THERMAL:
        temp = f", temperature.gpu={h.temperature_c:g}" if h.temperature_c is not None else ""
        out.append(_finding("thermal-slowdown", h.index, reasons + temp))
    if mask & _HW and not mask & (_THERMAL | _POWER_BRAKE):
        out.append(_finding("hw-slowdown", h.index, reasons))
    if mask & (_POWER_CAP | _POWER_BRAKE):
        power = "".join(f", {k}={v:g}" for k, v in (("power.draw", h.power_w), ("power.limit", h.power_limit_w))
                        if v is not None)
        out.append(_finding("power-slowdown", h.index, reasons + power,
                            severity=S.WARNING if mask & _POWER_BRAKE else S.INFO))
    if h.persistence_mode is False:
        out.append(_finding("persistence-off", h.index, f"persistence_mode={_yes(h.persistence_mode)}"))
    return out


def _xid_findings(events: Iterable[XidEvent], gpu_of_pci: Mapping[str, int]) -> list[HealthFinding]:
    groups: dict[tuple[object, int], list[XidEvent]] = {}
    for ev in events:
        gpu = gpu_of_pci.get(ev.pci) if ev.pci else None
        groups.setdefault((gpu if gpu is not None else ("pci", ev.pci), ev.xid), []).append(ev)
    out = []
    for (where, code), evs in groups.items():
        info = xid_info(code)
        action = info.action
        if code == 154:  # the line names the action: "... to 0x1 (GPU Reset Required)"
            word = recovery_word(evs[-1].message.rpartition("to ")[2])
            if word == "none":
                continue  # the recovery action was cleared
            action = _RECOVERY_ACTION.get(word or "", action)
        out.append(HealthFinding(f"xid-{code}", where if isinstance(where, int) else None, info.severity,
                                 info.meaning, action, info.remedy, evs[0].raw, count=len(evs)))
    return out


def health_findings(healths: Iterable[GpuHealth], xids: Iterable[XidEvent] = (), *,
                    gpu_of_pci: Mapping[str, int] | None = None) -> list[HealthFinding]:
    """Findings for each GPU's readings and for the Xids (one per GPU and Xid code, with a count): most severe
    first, then by GPU (None last), readings before Xids. gpu_of_pci maps PCI addresses (any spelling) to GPU
    indices; default: the readings' own. Idle, application-clock, sync-boost and display-clock reasons are never
    findings."""
    healths = list(healths)
    pci_map = pci_index(healths) if gpu_of_pci is None else \
        {normalize_pci(k) or k: v for k, v in gpu_of_pci.items()}
    found = [f for h in healths for f in _gpu_findings(h)] + _xid_findings(xids, pci_map)
    return sorted(found, key=lambda f: (-_SEVERITY_ORDER.index(f.severity), f.gpu is None, f.gpu or 0, _order(f.id)))


def _order(finding_id: str) -> tuple[int, int]:
    """Readings' findings in FINDINGS order, then Xids by number."""
    if finding_id in FINDINGS:
        return 0, list(FINDINGS).index(finding_id)
    return 1, int(finding_id.removeprefix("xid-"))


def worst_action(findings: Iterable[HealthFinding]) -> GpuAction | None:
    """The action that covers all of them (resetting the GPU also restarts its program, and so on); None if none
    asks for one."""
    actions = [f.action for f in findings if f.action is not None]
    return max(actions, key=_ACTION_ORDER.index) if actions else None


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> list[str]:
    """The "GPU health findings" section of docs/failures.md (failuredocs.markdown appends it)."""
    out = ["", "## GPU health findings", "",
           "`dflashctl` reports these per GPU (`gpu` is the index; null for an Xid whose PCI address matches no GPU "
           "the probe saw). The ids are part of the JSON contract. `action` is one of `restart the program`, "
           "`reset the GPU`, `drain the node`, `reboot`, or none. Readings the driver does not report (an older "
           "driver, a GPU without ECC) give no finding.", "",
           "| id | severity | what it means | action | what to do |", "|---|---|---|---|---|"]
    for s in FINDINGS.values():
        severity = "info / warning" if s.id == "power-slowdown" else str(s.severity)
        action = {"recovery-action": "the driver's: reset the GPU, reboot or drain the node",
                  "gpu-unreadable": "reboot (lost) or reset the GPU (reset required)"}.get(s.id, s.action)
        out.append(f"| `{s.id}` | {severity} | {_cell(s.meaning)} | {action or '—'} | {_cell(s.remedy)} |")
    for x in XID_TABLE.values():
        action = f"the one the line names (else {x.action})" if x.code == 154 else x.action
        out.append(f"| `xid-{x.code}` | {x.severity} | **{x.name}.** {_cell(x.meaning)} | {action or '—'} | "
                   f"{_cell(x.remedy)} |")
    generic = xid_info(-1)
    out.append(f"| `xid-N` (any other) | {generic.severity} | The NVIDIA driver reported an Xid dflashctl has no "
               f"specific advice for. | — | {_cell(generic.remedy)} |")
    return out
