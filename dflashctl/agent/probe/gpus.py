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

import contextlib
import os
import re
import signal
import subprocess
import threading
import time

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
END_REAP_S = 1.0  # a killed nvidia-smi is waited for this long
_SMI_REJECTED = re.compile(r'Field "([^"]+)" is not a valid field to query')


class SmiQuery:
    """`nvidia-smi --query-gpu` with the health fields this driver accepts: found on the first call, kept after.

    Each call runs in a process group of its own and, past its time, the whole group is killed: after an Xid 79
    nvidia-smi can hang for good, and one left behind outlives its caller (the sentinel exits, the run ends)."""

    def __init__(self) -> None:
        self.fields = [*SMI_QUERY.split(","), *SMI_HEALTH]
        self.missing: list[str] = []
        self.timeout_s: float = SMI_TIMEOUT_S
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None

    def cut(self, timeout_s: float) -> None:
        """From now on a call gets at most timeout_s (0: none starts), and the call in flight, if any, is ended now:
        a caller that stops waiting for a reading (another thread) takes its nvidia-smi with it."""
        with self._lock:  # killed under the lock, only while not yet reaped: its pid (the group) cannot be reused
            self.timeout_s = timeout_s
            child = self._child
            if child is None or child.poll() is not None:
                return
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(END_REAP_S)

    def run(self) -> tuple[str | None, str | None]:
        """(csv, None) or (None, why not)."""
        limit = self.timeout_s
        deadline = time.monotonic() + limit
        for _ in range(2 * len(SMI_HEALTH) + 1):
            try:
                res = self._call(["nvidia-smi", "--query-gpu=" + ",".join(self.fields), "--format=csv,nounits"],
                                 deadline - time.monotonic())
            except FileNotFoundError:
                return None, "nvidia-smi not found"
            except subprocess.TimeoutExpired:
                return None, f"nvidia-smi timed out after {limit:g}s"
            if res.returncode == 0:
                return res.stdout.decode("utf-8", "replace"), None
            text = (res.stderr + b"\n" + res.stdout).decode("utf-8", "replace")
            rejected = _SMI_REJECTED.search(text)
            if res.returncode == 2 and rejected and self._drop(rejected.group(1)):
                continue
            msg = " | ".join((res.stderr or res.stdout).decode("utf-8", "replace").strip().splitlines()[-3:])
            return None, f"nvidia-smi exit {res.returncode}: {msg}"
        return None, "nvidia-smi rejected every health field"

    def _call(self, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess:
        with self._lock:
            timeout_s = min(timeout_s, self.timeout_s)  # a cut() since the reading began counts too
            if timeout_s <= 0:
                raise subprocess.TimeoutExpired(argv, 0)
            child = self._child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end(child)
            raise
        finally:
            with self._lock:
                self._child = None
        return subprocess.CompletedProcess(argv, child.returncode, out, err)

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


def _end(child: subprocess.Popen) -> None:
    """Kill a call's whole group and reap it (bounded: a process stuck in the driver may not die at once)."""
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(END_REAP_S)


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

