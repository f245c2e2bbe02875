"""The probe's GPU samples, NVML when importable and working, else nvidia-smi CSV, else none.

The CSV crosses as nvidia-smi printed it, header included, so the laptop's one parser (analysis/gpus.py) reads
the columns by name rather than by position. Values pass through as text (`[N/A]`, `[Not Supported]`, `Enabled`,
`No`, `0x0000000000000004`): the laptop parses them.

The report: {"source": "nvml" | "nvidia-smi" | None, "nvml": [record per GPU (nvml.py)], "smi_csv": str | None,
"error": str | None, "smi_missing": [query fields this driver's nvidia-smi rejected]}.

A GpuReader keeps NVML initialised with its handles (nvml.py NvmlReader) and, on the nvidia-smi path, the field
list the driver accepted, so a --watch makes one nvidia-smi call per sample after the first. gpu_report() without
a reader reads once and closes (what the sentinel and the restart wait call).
"""

from __future__ import annotations

import re
import subprocess

from dflashctl.agent.probe.nvml import NvmlReader

SMI_QUERY = "index,uuid,name,memory.used,memory.total,utilization.gpu,power.draw"
# The health columns, asked after SMI_QUERY's (names of nvidia-smi --help-query-gpu, drivers 535-590). A driver
# that rejects one answers `Field "X" is not a valid field to query.` (exit 2): it is asked again without it.
SMI_HEALTH = ("pci.bus_id", "temperature.gpu", "power.limit", "persistence_mode",
              "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "remapped_rows.pending",
              "remapped_rows.failure", "clocks_event_reasons.active",
              "enforced.power.limit", "remapped_rows.correctable", "remapped_rows.uncorrectable", "gpu_recovery_action")
SMI_OLD_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}  # before R535
SMI_TIMEOUT_S = 20
_SMI_REJECTED = re.compile(r'Field "([^"]+)" is not a valid field to query')


class SmiQuery:
    """`nvidia-smi --query-gpu` with the health fields this driver accepts: found on the first call, kept after."""

    def __init__(self) -> None:
        self.fields = [*SMI_QUERY.split(","), *SMI_HEALTH]
        self.missing: list[str] = []

    def run(self) -> tuple[str | None, str | None]:
        """(csv, None) or (None, why not)."""
        for _ in range(2 * len(SMI_HEALTH) + 1):
            try:
                res = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(self.fields), "--format=csv,nounits"],
                                     stdin=subprocess.DEVNULL, capture_output=True, timeout=SMI_TIMEOUT_S)
            except FileNotFoundError:
                return None, "nvidia-smi not found"
            except subprocess.TimeoutExpired:
                return None, f"nvidia-smi timed out after {SMI_TIMEOUT_S}s"
            if res.returncode == 0:
                return res.stdout.decode("utf-8", "replace"), None
            text = (res.stderr + b"\n" + res.stdout).decode("utf-8", "replace")
            rejected = _SMI_REJECTED.search(text)
            if res.returncode == 2 and rejected and self._drop(rejected.group(1)):
                continue
            msg = " | ".join((res.stderr or res.stdout).decode("utf-8", "replace").strip().splitlines()[-3:])
            return None, f"nvidia-smi exit {res.returncode}: {msg}"
        return None, "nvidia-smi rejected every health field"

    def _drop(self, field: str) -> bool:
        """Stop asking for a rejected health field (its older name instead, where it has one); False for a field
        that is not ours to drop."""
        if field not in self.fields or field in SMI_QUERY.split(","):
            return False
        i = self.fields.index(field)
        self.missing.append(field)
        old = SMI_OLD_NAMES.get(field)
        if old and old not in self.fields and old not in self.missing:
            self.fields[i] = old
        else:
            del self.fields[i]
        return True


class GpuReader:
    """What a probe keeps between samples: NVML (initialised once, handles kept) or the nvidia-smi field list."""

    def __init__(self) -> None:
        self.nvml: NvmlReader | None = None
        self.smi = SmiQuery()
        self._no_bindings: str | None = None  # pynvml cannot be imported: not tried again

    def report(self) -> dict:
        nvml_error = None
        try:
            if self.nvml is None:
                self.nvml = self._open_nvml()
            return {"source": "nvml", "nvml": self.nvml.read(), "smi_csv": None, "error": None, "smi_missing": []}
        except Exception as e:  # ImportError, NVMLError (no driver), anything: fall back to nvidia-smi
            nvml_error = self._no_bindings or f"{type(e).__name__}: {e}"
            if type(e).__name__ == "NVMLError_LibraryNotFound":  # no libnvidia-ml here: it will not appear later
                self._no_bindings = nvml_error
            if self.nvml is not None:
                self.nvml.close()
                self.nvml = None  # NVML is tried again next sample (a driver may come back)
        csv, why = self.smi.run()
        if csv is None:
            if why == "nvidia-smi not found":
                why = f"no GPUs visible: nvidia-smi not found ({nvml_error})"
            return {"source": None, "nvml": [], "smi_csv": None, "error": why, "smi_missing": list(self.smi.missing)}
        return {"source": "nvidia-smi", "nvml": [], "smi_csv": csv, "error": None,
                "smi_missing": list(self.smi.missing)}

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
            self.nvml = None

    def _open_nvml(self) -> NvmlReader:
        if self._no_bindings is not None:
            raise ImportError(self._no_bindings)
        try:
            import pynvml
        except ImportError as e:
            self._no_bindings = f"{type(e).__name__}: {e}"
            raise
        return NvmlReader(pynvml)

    def __enter__(self) -> GpuReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gpu_report(reader: GpuReader | None = None) -> dict:
    """One GPU report: with a reader, through it (it stays open); without, a reader of its own, closed after."""
    if reader is not None:
        return reader.report()
    with GpuReader() as own:
        return own.report()

