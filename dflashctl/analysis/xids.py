"""NVIDIA Xid reports in the kernel log → model.XidEvent, and what each Xid asks for. Pure: lines in, records out.

Lines as `dmesg`, `dmesg -T`, `journalctl -k` and syslog print them (whatever comes before `NVRM:` is
ignored):
- `NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.` (pid/name since about R460;
  `pid='<unknown>', name=<unknown>` when the driver could not tell);
- older `NVRM: Xid (PCI:0000:41:00): 13, Graphics Exception: …` and `NVRM: Xid (0000:18:00): 13, …` with no pid/name;
- "fallen off the bus" printed without an Xid number — `NVRM: GPU at 0000:01:00.0 has fallen off the bus.` and the
  three lines `NVRM: The NVIDIA GPU 0000:b3:00.0` / `(PCI ID: …) installed in this system has` / `fallen off the bus
  and is not responding to commands.` of newer drivers — counted as Xid 79: the GPU is gone either way.
Meanings and actions follow NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, the Ampere-and-newer table's
"immediate action", and the A100 memory error management guide), mapped onto model.GpuAction.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from dflashctl.model import GpuAction, HealthSeverity, XidEvent

A, S = GpuAction, HealthSeverity


@dataclass(frozen=True)
class XidInfo:
    """What one Xid means and what to do: action is the immediate one (None: no recovery action helps; see remedy)."""

    code: int
    name: str
    meaning: str
    action: GpuAction | None
    severity: HealthSeverity
    remedy: str


def _row(code: int, name: str, severity: HealthSeverity, action: GpuAction | None, meaning: str,
         remedy: str) -> tuple[int, XidInfo]:
    return code, XidInfo(code, name, meaning, action, severity, remedy)


XID_TABLE: dict[int, XidInfo] = dict([
    _row(13, "Graphics engine exception", S.WARNING, A.RESTART_PROGRAM,
         "A kernel faulted on the GPU: almost always the program's own bug (an index out of range, an illegal "
         "instruction), rarely the driver or hardware.",
         "Restart the program; if it recurs, run it with CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer. Repeats "
         "on one GPU with known-good code: run `dcgmi diag -r 3` on it."),
    _row(31, "GPU memory page fault (MMU error)", S.WARNING, A.RESTART_PROGRAM,
         "A unit of the GPU accessed a virtual address that is not mapped: usually the program's illegal memory "
         "access (CUDA `an illegal memory access was encountered`), sometimes a driver or hardware fault.",
         "Restart the program and debug the access (CUDA_LAUNCH_BLOCKING=1); faults on one GPU with different "
         "programs point at the GPU: run `dcgmi diag`."),
    _row(43, "GPU stopped processing", S.INFO, A.RESTART_PROGRAM,
         "The driver stopped a program's GPU work after a fault the program caused; the GPU itself stays healthy.",
         "Restart the program; the cause is in its own log (the exception or Xid before this one)."),
    _row(45, "Preemptive cleanup, due to previous errors", S.INFO, A.RESTART_PROGRAM,
         "The driver tore down a program's GPU channels because it ended (Ctrl-C, SIGKILL, a crash) or because of "
         "an earlier error; on its own it is a consequence, not a cause.",
         "Restart the program; look for the Xid or exception just before this one (the line often names it: "
         "`caused by previous Xid N`)."),
    _row(48, "Double-bit (uncorrectable) ECC error", S.CRITICAL, A.RESET_GPU,
         "GPU memory returned data ECC could not correct; the program using it got wrong data and was stopped. "
         "On Ampere and newer it is followed by Xid 63/64 (row remap) and 94/95 (contained or not).",
         "Reset the GPU (`nvidia-smi -r -i N`, or reboot) before the next run; recurring DBEs on one GPU are a "
         "hardware fault."),
    _row(62, "Internal micro-controller halt", S.CRITICAL, A.RESET_GPU,
         "A micro-controller inside the GPU (often the GSP or PMU firmware) halted; the GPU stops responding.",
         "Reset the GPU, reboot if that fails; recurring on one driver version: update the driver."),
    _row(63, "ECC page retirement or row remapping recorded", S.WARNING, A.RESET_GPU,
         "A bad memory row (or, before Ampere, page) was recorded for repair; the spare row takes over at the next "
         "GPU reset. Programs running now are not affected.",
         "Reset the GPU when the run ends (`nvidia-smi -r -i N`, or reboot) so the remap takes effect."),
    _row(64, "ECC page retirement or row remapping failure", S.CRITICAL, A.RESET_GPU,
         "Recording a memory repair failed (no spare row left, or the same row failed again): the GPU can no "
         "longer repair that memory.",
         "Reset the GPU; if `row-remap-failed` shows afterwards or it recurs, drain: stop using the GPU and plan an "
         "RMA (NVIDIA's row-remapping failure criterion)."),
    _row(74, "NVLink error", S.CRITICAL, A.RESET_GPU,
         "An NVLink connection reported a fatal error; the fault can be this GPU's link or the device at the other "
         "end, and collectives over that link fail.",
         "Reset the GPU (or reboot); check `nvidia-smi nvlink -e` / `-s`; errors that persist after a reset are "
         "hardware (link, bridge or NVSwitch)."),
    _row(79, "GPU has fallen off the bus", S.CRITICAL, A.REBOOT,
         "The GPU stopped answering on PCIe; every program on it is dead and nvidia-smi can no longer reach it. "
         "Common causes: power delivery, overheating, a loose card or riser, a failing GPU.",
         "Drain the node's work and reboot (often only a power cycle brings it back); if it recurs, check power "
         "cables, the supply, cooling and seating before reusing the GPU."),
    _row(94, "Contained ECC error", S.WARNING, A.RESTART_PROGRAM,
         "An uncorrectable ECC error was contained: only the program that touched the memory was stopped; others "
         "keep running and the row is remapped at the next reset.",
         "Restart the program; reset the GPU when convenient so the remap takes effect."),
    _row(95, "Uncontained ECC error", S.CRITICAL, A.RESET_GPU,
         "An uncorrectable ECC error could not be contained: every program on this GPU may have read bad data.",
         "Stop the GPU's programs and reset it (`nvidia-smi -r -i N`, or reboot); recurring: hardware fault."),
    _row(119, "GSP RPC timeout", S.CRITICAL, A.RESET_GPU,
         "The GPU System Processor firmware stopped answering the driver (`Timeout waiting for RPC from GSP`); the "
         "GPU hangs, nvidia-smi may hang with it.",
         "Reset the GPU, reboot if the reset fails; recurring: update the driver (several releases had GSP bugs)."),
    _row(120, "GSP error", S.CRITICAL, A.RESET_GPU,
         "The GPU System Processor firmware reported an error or crashed.",
         "Reset the GPU, reboot if the reset fails; recurring: update the driver."),
    _row(154, "GPU recovery action changed", S.CRITICAL, A.RESET_GPU,
         "The driver now says what this GPU needs before it can be used again (the line names it: GPU reset, node "
         "reboot, drain).",
         "Do what the line says (`nvidia-smi -q` shows it as GPU Recovery Action), then start the run again."),
])


def xid_info(code: int) -> XidInfo:
    """The table's row, or a generic one: an Xid we know nothing specific about is still reported, never dropped."""
    known = XID_TABLE.get(code)
    if known is not None:
        return known
    return XidInfo(code, f"Xid {code}", f"The NVIDIA driver reported Xid {code}, which dflashctl has no specific "
                   "advice for.", None, S.WARNING,
                   "Look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) and read the lines "
                   "around it in `dmesg`.")


_PCI_RE = re.compile(r"^(?:PCI:)?(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,4}):(?P<dev>[0-9a-fA-F]{1,2})"
                     r"(?:\.[0-7])?$")


def normalize_pci(text: str | None) -> str | None:
    """`0000:18:00` from nvidia-smi's `00000000:18:00.0`, NVML's, or a kernel line's `PCI:0000:18:00` / `0000:18:00`
    (the very old `0003:00` is bus 03 of domain 0): the one spelling both sides compare by. None if not an address."""
    if not isinstance(text, str):
        return None
    m = _PCI_RE.match(text.strip())
    if not m:
        return None
    dom, bus, dev = int(m["dom"] or "0", 16), int(m["bus"], 16), int(m["dev"], 16)
    if dom > 0xFFFF or bus > 0xFF or dev > 0x1F:
        return None
    return f"{dom:04x}:{bus:02x}:{dev:02x}"


def recovery_word(text: object) -> str | None:
    """The driver's recovery advice in one word: none | reset | reboot | drain (NVML's enum names, nvidia-smi's
    `gpu_recovery_action`, Xid 154's `(GPU Reset Required)`); an unknown spelling comes back lower-cased as is."""
    if not isinstance(text, str) or not text.strip():
        return None
    t = text.strip().lower()
    for word in ("drain", "reboot", "reset", "none"):  # "drain and reset" drains first
        if word in t:
            return word
    return t


_XID_RE = re.compile(r"NVRM: Xid \((?P<addr>[^)]*)\): (?P<xid>\d+)(?:,\s*(?P<rest>.*))?$")
_PID_RE = re.compile(r"^pid=(?P<pid>'[^']*'|[^,]*)(?:,\s*|$)")
_NAME_RE = re.compile(r"^name=(?P<name>[^,]*)(?:,\s*|$)")
_ADDR = r"(?P<addr>(?:PCI:)?[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_FELL_RE = re.compile(r"NVRM: GPU (?:at )?" + _ADDR + r":? (?:GPU )?has fallen off the bus")
_THE_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU " + _ADDR + r"\s*$")
_FOLLOW_LINES = 3  # a split "fallen off the bus" message ends within this many lines of its address


def _unknown(value: str | None) -> str | None:
    v = (value or "").strip().strip("'\"")
    return None if not v or v.lower() in ("<unknown>", "unknown", "n/a") else v


def parse_xid_line(line: str) -> XidEvent | None:
    """One kernel-log line as an XidEvent, or None if it is not an Xid (or one-line "fallen off the bus") report."""
    text = line.rstrip("\r\n")
    m = _XID_RE.search(text)
    if m:
        rest = (m["rest"] or "").strip()
        pid_m = _PID_RE.match(rest)
        pid = _unknown(pid_m["pid"]) if pid_m else None
        rest = rest[pid_m.end():] if pid_m else rest
        name_m = _NAME_RE.match(rest)
        rest = rest[name_m.end():] if name_m else rest
        return XidEvent(xid=int(m["xid"]), pci=normalize_pci(m["addr"]),
                        pid=int(pid) if pid is not None and pid.isdigit() else None,
                        process=_unknown(name_m["name"]) if name_m else None, message=rest.strip(), raw=text)
    m = _FELL_RE.search(text)
    if m:
        return XidEvent(xid=79, pci=normalize_pci(m["addr"]), pid=None, process=None,
                        message="GPU has fallen off the bus", raw=text)
    return None


def xid_events(lines: Iterable[str] | str) -> list[XidEvent]:
    """Every Xid report in a kernel log, in order (also the split three-line "fallen off the bus" message)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    out: list[XidEvent] = []
    pending: tuple[str, int] | None = None  # (first line, lines left) of a split message
    for line in lines:
        event = parse_xid_line(line)
        if event is not None:
            out.append(event)
            pending = None
            continue
        m = _THE_GPU_RE.search(line)
        if m:
            pending = (line.rstrip("\r\n"), _FOLLOW_LINES)
            continue
        if pending is None:
            continue
        first, left = pending
        if "fallen off the bus" in line:
            addr = _THE_GPU_RE.search(first)
            out.append(XidEvent(xid=79, pci=normalize_pci(addr["addr"]) if addr else None, pid=None, process=None,
                                message="GPU has fallen off the bus", raw=first + "\n" + line.rstrip("\r\n")))
            pending = None
        else:
            pending = (first, left - 1) if left > 1 else None
    return out
