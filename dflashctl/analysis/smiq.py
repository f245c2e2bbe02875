"""`nvidia-smi -q` (the full-text query) → model.GpuHealth, one per GPU section. Pure: text in, records out.

The text is a tree: a `GPU 00000000:18:00.0` header per GPU, then `Key : Value` lines nested by indentation
(`ECC Errors` > `Volatile` > `DRAM Uncorrectable`); a line can carry a value and children at once (`HW Slowdown :
Active` over `HW Thermal Slowdown`). Labels are matched case-blind, and they moved between drivers:
- R470 and before: `Clocks Throttle Reasons`; `Power Readings` > `Power Draw`, `Enforced Power Limit`; ECC
  `Volatile` > `Double Bit` > `Total`; `Retired Pages` > `Pending Page Blacklist` (older: `Pending`);
  `Remapped Rows : N/A` on GPUs before Ampere;
- Ampere and later: ECC as `DRAM Uncorrectable` + `SRAM Uncorrectable` (Hopper on R535+: `SRAM Uncorrectable
  Parity` + `SRAM Uncorrectable SEC-DED`): whatever uncorrectable counts are there are summed;
- R535: `Clocks Event Reasons`, `GPU Power Readings` > `Power Draw`, `Current Power Limit`, and `GPU Reset Status`
  (`Reset Required`, `Drain and Reset Recommended`) where later drivers print `GPU Recovery Action`;
- later (R590 in the samples): `Average Power Draw` / `Instantaneous Power Draw` (the average first, as
  `--query-gpu`'s power.draw is on Ampere and later; the instantaneous where it is N/A), `GPU Recovery Action`.
`N/A`, `[N/A]`, `Not Supported`, `Unknown` … are None, never a guess; a reading the driver says it does not support
is named (by its `--query-gpu` field) in `unsupported`. -q prints no index: a GPU's index is its position in the
output (the one GPU of `nvidia-smi -q -i 3` is index 0). NVML's clock-event bit table lives here, shared with
gpuhealth.py, which reads these records for a GpuReport whose source is "nvidia-smi-q".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from dflashctl.analysis.gpus import csv_number, na
from dflashctl.analysis.xids import normalize_pci, recovery_word
from dflashctl.model import GpuHealth

# NVML's nvmlClocksEventReason* bits (nvml.h; pynvml has the same values), named as nvidia-smi names the columns.
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The same reasons as -q labels them (under `Clocks Event Reasons`, or `Clocks Throttle Reasons` before R535).
Q_REASON_BITS: dict[str, int] = {
    "idle": 0x1, "applications clocks setting": 0x2, "sw power cap": 0x4, "hw slowdown": 0x8, "sync boost": 0x10,
    "sw thermal slowdown": 0x20, "hw thermal slowdown": 0x40, "hw power brake slowdown": 0x80,
    "display clock setting": 0x100,
}
_BANNER = "==============NVSMI LOG=============="
_GPU_RE = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_YES, _NO = ("enabled", "yes", "active"), ("disabled", "no", "not active")


def decode_reasons(mask: int | None) -> tuple[str, ...]:
    """The bitmask's reasons by nvidia-smi name, lowest bit first; a bit NVML does not define yet as `0x…`."""
    if mask is None:
        return ()
    bits = [1 << i for i in range(mask.bit_length()) if mask >> i & 1]
    return tuple(THROTTLE_BITS.get(b, f"0x{b:x}") for b in bits)


@dataclass
class _Node:
    key: str  # lower-cased
    value: str | None  # as printed (stripped); None on a section line
    children: list[_Node] = field(default_factory=list)

    def get(self, *names: str) -> _Node | None:
        """The child with the first of names that is there."""
        for name in names:
            for child in self.children:
                if child.key == name:
                    return child
        return None

    def walk(self) -> Iterator[_Node]:
        for child in self.children:
            yield child
            yield from child.walk()


def _sections(text: str) -> Iterator[tuple[str, _Node]]:
    """(the header's PCI address, the GPU's tree) per `GPU …` section; a section ends at the next header or at any
    other line that starts at column 0."""
    address: str | None = None
    stack: list[tuple[int, _Node]] = []
    for raw in text.expandtabs(8).splitlines():
        line = raw.rstrip()
        if not line:
            continue
        header = _GPU_RE.match(line)
        indent = len(line) - len(line.lstrip())
        if header or indent == 0:
            if address is not None:
                yield address, stack[0][1]
            address = header.group(1) if header else None
            stack = [(-1, _Node("gpu", None))]
            continue
        if address is None:
            continue
        key, colon, value = line.strip().partition(":")
        node = _Node(key.strip().lower(), value.strip() if colon else None)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    if address is not None:
        yield address, stack[0][1]


def looks_like_q(text: str) -> bool:
    """Whether text is `nvidia-smi -q` output: its `NVSMI LOG` banner, or (an excerpt) a `GPU 0000…:…` header
    line followed by an indented `Key : Value` line."""
    if _BANNER in text:
        return True
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return any(_GPU_RE.match(a) and b[:1].isspace() and " : " in b for a, b in zip(lines, lines[1:], strict=False))


def _na(value: str | None) -> str | None:
    v = na(value)
    return None if v is None or v.lower().startswith(("unknown", "not supported", "requested functionality")) else v


def _flag(value: str | None) -> bool | None:
    v = (_na(value) or "").lower()
    return True if v in _YES else False if v in _NO else None


def _count(value: str | None) -> int | None:
    x = csv_number(_na(value))
    return int(x) if x is not None and x.is_integer() else None


class _Reader:
    """One GPU's tree; remembers the readings the driver called not supported (by their --query-gpu names)."""

    def __init__(self, gpu: _Node) -> None:
        self.gpu = gpu
        self.unsupported: list[str] = []

    def value(self, name: str, node: _Node | None, *path: tuple[str, ...]) -> str | None:
        """The value at path under node (each step: the names it may have); `name` is the reading's field name."""
        for names in path:
            node = node.get(*names) if node is not None else None
        if node is None or node.value is None:
            return None
        if node.value.strip("[] ").lower() == "not supported" and name not in self.unsupported:
            self.unsupported.append(name)
        return _na(node.value)

    def first_number(self, name: str, node: _Node | None, *keys: str) -> float | None:
        """The first of keys (in that order) under node that holds a number."""
        for key in keys:
            x = csv_number(self.value(name, node, (key,)))
            if x is not None:
                return x
        return None

    def ecc_uncorrected_volatile(self) -> int | None:
        name = "ecc.errors.uncorrected.volatile.total"
        volatile = self.gpu.get("ecc errors")
        volatile = volatile.get("volatile") if volatile is not None else None
        if volatile is None:
            return None
        double_bit = volatile.get("double bit")
        if double_bit is not None:  # R470 and before: Double Bit > Total
            return _count(self.value(name, double_bit, ("total",)))
        counts = [_count(self.value(name, c)) for c in volatile.children if "uncorrectable" in c.key]
        known = [n for n in counts if n is not None]
        return sum(known) if known else None

    def recovery(self) -> str | None:
        if self.gpu.get("gpu recovery action") is not None:
            return recovery_word(self.value("gpu_recovery_action", self.gpu, ("gpu recovery action",)))
        status = self.gpu.get("gpu reset status")  # R535: the same advice as two flags
        reset = _flag(self.value("reset_status.reset_required", status, ("reset required",)))
        drain = _flag(self.value("reset_status.drain_and_reset_recommended", status, ("drain and reset recommended",)))
        return "drain" if drain else "reset" if reset else "none" if reset is False else None

    def clocks_event_reasons(self) -> int | None:
        """The bits of the reasons marked Active; None when no reason says Active or Not Active."""
        section = self.gpu.get("clocks event reasons", "clocks throttle reasons")
        mask = None
        for node in section.walk() if section is not None else ():
            bit, state = Q_REASON_BITS.get(node.key), _flag(node.value)
            if bit is not None and state is not None:
                mask = (mask or 0) | (bit if state else 0)
        return mask


def _health(address: str, gpu: _Node, position: int) -> GpuHealth:
    r = _Reader(gpu)
    power = gpu.get("gpu power readings", "power readings")  # not Module / GPU Memory Power Readings
    rows = gpu.get("remapped rows")
    retired = ("pending page blacklist", "pending")
    mask = r.clocks_event_reasons()
    return GpuHealth(
        index=position, pci_bus_id=normalize_pci(address), uuid=r.value("uuid", gpu, ("gpu uuid",)),
        name=r.value("name", gpu, ("product name",)),
        temperature_c=csv_number(r.value("temperature.gpu", gpu, ("temperature",), ("gpu current temp",))),
        power_w=r.first_number("power.draw", power, "power draw", "average power draw", "instantaneous power draw"),
        power_limit_w=r.first_number("enforced.power.limit", power, "enforced power limit", "current power limit",
                                     "power limit"),
        persistence_mode=_flag(r.value("persistence_mode", gpu, ("persistence mode",))),
        ecc_uncorrected_volatile=r.ecc_uncorrected_volatile(),
        retired_pages_pending=_flag(r.value("retired_pages.pending", gpu, ("retired pages",), retired)),
        remapped_rows_pending=_flag(r.value("remapped_rows.pending", rows, ("pending",))),
        remapped_rows_failure=_flag(r.value("remapped_rows.failure", rows, ("remapping failure occurred",))),
        remapped_rows_uncorrectable=_count(r.value("remapped_rows.uncorrectable", rows, ("uncorrectable error",))),
        remapped_rows_correctable=_count(r.value("remapped_rows.correctable", rows, ("correctable error",))),
        recovery_action=r.recovery(), clocks_event_reasons=mask, throttle_reasons=decode_reasons(mask),
        unsupported=tuple(r.unsupported),
    )


def gpu_health_from_q(text: str) -> list[GpuHealth]:
    """One GpuHealth per `GPU …` section of `nvidia-smi -q` text, in the order printed (index = position); [] for
    text without one."""
    return [_health(address, gpu, i) for i, (address, gpu) in enumerate(_sections(text))]
