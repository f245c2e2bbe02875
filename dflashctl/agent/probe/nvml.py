"""NVML readings for the probe: one reader that initialises NVML once and keeps its device handles (stdlib only).

The bindings (nvidia-ml-py's `pynvml`, or a test's stand-in) are passed in: gpus.py is the one place that imports
them. Each GPU's record is the probe's `gpus.nvml` dict: what analysis/gpus.py `from_nvml` reads (index, uuid,
name, memory_used_mib, memory_total_mib, utilization_pct, power_w) plus the health fields (pci_bus_id,
temperature_c, power_limit_w, persistence_mode, ecc_uncorrected_volatile, retired_pages_pending, remapped_rows,
recovery_action, recovery_action_code, clocks_event_reasons). A field whose call fails is None and its name is
in "unsupported" (other failures than "not supported" also in "field_errors"). A GPU whose handle went stale
(lost, reset, NVML shut down under us) is one record with "error" set, and the handles are acquired again on the
next read; otherwise handles are acquired once for the reader's life.
"""

from __future__ import annotations

import contextlib

# nvmlDeviceGpuRecoveryAction_t (nvml.h; NVIDIA's "Error Recovery and Response Flags"): 0 none, 1 GPU reset,
# 2 node reboot, 3 drain P2P, 4 drain P2P and reset, 5 recover IMEX domain, 6 PCIe bus reset, 7 system reboot.
# Codes outside the four words stay None here; recovery_action_code carries the number either way.
NVML_RECOVERY_ACTIONS = {0: "none", 1: "reset", 2: "reboot", 3: "drain", 4: "reset", 6: "reset", 7: "reboot"}
NVML_RECOVERY_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h), for bindings that lack the constant
# Errors that mean the handle (or NVML itself) is no longer valid: re-acquire instead of reporting a field.
_NVML_STALE = ("NVML_ERROR_UNINITIALIZED", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_GPU_IS_LOST",
               "NVML_ERROR_RESET_REQUIRED", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_GPU_NOT_FOUND")
# Errors that only say "this GPU / driver / binding cannot tell": listed in unsupported, not in field_errors.
_NVML_QUIET = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NOT_FOUND", "NVML_ERROR_FUNCTION_NOT_FOUND")
_NVML_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class NvmlStale(Exception):
    """A device call raised an error that invalidates its handle (carries the NVML error)."""


class NvmlReader:
    """nvmlInit once, device handles once; read() gives one record per GPU, close() shuts NVML down.

    `acquired` counts handle acquisitions (1 for a healthy reader's whole life)."""

    def __init__(self, lib) -> None:  # noqa: ANN001 - lib: the pynvml module (or a stand-in with its API)
        self.lib = lib
        self.acquired = 0
        self._inited = False
        self._devices: list | None = None  # [handle or None, static fields, acquisition error or None]
        self._stale = {getattr(lib, n) for n in _NVML_STALE if hasattr(lib, n)}
        self._quiet = {getattr(lib, n) for n in _NVML_QUIET if hasattr(lib, n)}

    def read(self) -> list[dict]:
        """One record per GPU. Raises lib.NVMLError when NVML itself cannot start or count GPUs (the caller falls
        back to nvidia-smi and may try again later)."""
        if self._devices is None:
            self._acquire()
        out, stale = [], False
        for i, dev in enumerate(self._devices or []):
            try:
                if dev[0] is None:
                    raise NvmlStale(dev[2])
                out.append(self._read_device(i, dev))
            except NvmlStale as e:
                stale = True
                out.append(_nvml_error_record(i, dev[1], e.args[0]))
        if stale:
            self._devices = None  # acquired again on the next read
        return out

    def close(self) -> None:
        self._devices = None
        if self._inited:
            self._inited = False
            with contextlib.suppress(self.lib.NVMLError):
                self.lib.nvmlShutdown()

    def __enter__(self) -> NvmlReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- acquisition ---

    def _acquire(self) -> None:
        lib = self.lib
        if not self._inited:
            lib.nvmlInit()
            self._inited = True
        try:
            count = lib.nvmlDeviceGetCount()
        except lib.NVMLError as e:
            if getattr(e, "value", None) == getattr(lib, "NVML_ERROR_UNINITIALIZED", -1):
                self._inited = False
            raise
        devices = []
        for i in range(count):
            try:
                devices.append([lib.nvmlDeviceGetHandleByIndex(i), {}, None])
            except lib.NVMLError as e:
                devices.append([None, {}, e])
        self._devices = devices
        self.acquired += 1

    # --- one device ---

    def _read_device(self, index: int, dev: list) -> dict:
        lib, h, static = self.lib, dev[0], dev[1]
        rec: dict = {"index": index, "error": None, "unsupported": [], "field_errors": {}}
        for key, fn in (("name", lib.nvmlDeviceGetName), ("uuid", lib.nvmlDeviceGetUUID),
                        ("pci_bus_id", self._pci_bus_id)):
            if key not in static:
                value = self._call(rec, key, fn, h)
                if value is not None:
                    static[key] = _nvml_text(value)
            rec[key] = static.get(key)
        mem = self._call(rec, "memory_used_mib", lib.nvmlDeviceGetMemoryInfo, h)
        rec["memory_used_mib"] = mem.used / 1048576.0 if mem is not None else None
        rec["memory_total_mib"] = mem.total / 1048576.0 if mem is not None else None
        if mem is None:
            rec["unsupported"].append("memory_total_mib")
        util = self._call(rec, "utilization_pct", lib.nvmlDeviceGetUtilizationRates, h)
        rec["utilization_pct"] = float(util.gpu) if util is not None else None
        rec["power_w"] = _nvml_scaled(self._call(rec, "power_w", lib.nvmlDeviceGetPowerUsage, h), 1000.0)
        temp = self._call(rec, "temperature_c", lib.nvmlDeviceGetTemperature, h,
                          getattr(lib, "NVML_TEMPERATURE_GPU", 0))
        rec["temperature_c"] = float(temp) if temp is not None else None
        rec["power_limit_w"] = _nvml_scaled(
            self._call(rec, "power_limit_w", lib.nvmlDeviceGetEnforcedPowerLimit, h), 1000.0)
        pm = self._call(rec, "persistence_mode", lib.nvmlDeviceGetPersistenceMode, h)
        rec["persistence_mode"] = pm == getattr(lib, "NVML_FEATURE_ENABLED", 1) if pm is not None else None
        ecc = self._call(rec, "ecc_uncorrected_volatile", lib.nvmlDeviceGetTotalEccErrors, h,
                         getattr(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), getattr(lib, "NVML_VOLATILE_ECC", 0))
        rec["ecc_uncorrected_volatile"] = int(ecc) if ecc is not None else None
        pending = self._call(rec, "retired_pages_pending",
                             getattr(lib, "nvmlDeviceGetRetiredPagesPendingStatus", None), h)
        rec["retired_pages_pending"] = bool(pending) if pending is not None else None
        rows = self._call(rec, "remapped_rows", getattr(lib, "nvmlDeviceGetRemappedRows", None), h)
        rec["remapped_rows"] = None if rows is None else {
            "correctable": int(rows[0]), "uncorrectable": int(rows[1]), "pending": bool(rows[2]),
            "failure": bool(rows[3])}
        code = self._call(rec, "recovery_action", self._recovery_action, h)
        rec["recovery_action_code"] = code
        rec["recovery_action"] = NVML_RECOVERY_ACTIONS.get(code) if code is not None else None
        reasons = self._call(rec, "clocks_event_reasons", self._clocks_event_reasons, h)
        rec["clocks_event_reasons"] = int(reasons) if reasons is not None else None
        return rec

    def _call(self, rec: dict, name: str, fn, *args):  # noqa: ANN001, ANN202 - fn: a binding function
        """fn(*args); None (name listed) where the binding lacks it or NVML cannot tell; NvmlStale where the
        handle is gone."""
        if fn is None:
            rec["unsupported"].append(name)
            return None
        try:
            return fn(*args)
        except self.lib.NVMLError as e:
            value = getattr(e, "value", None)
            if value in self._stale:
                raise NvmlStale(e) from None
            rec["unsupported"].append(name)
            if value not in self._quiet:
                rec["field_errors"][name] = f"{type(e).__name__}: {e}"
            return None
        except (AttributeError, TypeError, ValueError) as e:  # a binding of another shape
            rec["unsupported"].append(name)
            rec["field_errors"][name] = f"{type(e).__name__}: {e}"
            return None

    def _pci_bus_id(self, h) -> str | None:  # noqa: ANN001
        pci = self.lib.nvmlDeviceGetPciInfo(h)
        bus = getattr(pci, "busId", b"") or getattr(pci, "busIdLegacy", b"")
        return _nvml_text(bus) or None

    def _recovery_action(self, h) -> int | None:  # noqa: ANN001
        lib = self.lib
        get = getattr(lib, "nvmlDeviceGetFieldValues", None)
        if get is None:
            raise lib.NVMLError(getattr(lib, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))
        # bindings older than the constant can still ask a driver that knows the field by its number
        (value,) = get(h, [getattr(lib, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", NVML_RECOVERY_FIELD)])[:1]
        ret = getattr(value, "nvmlReturn", 0)
        if ret != getattr(lib, "NVML_SUCCESS", 0):
            raise lib.NVMLError(ret)  # a driver that does not know the field answers NOT_SUPPORTED per field
        member = _NVML_VALUE_MEMBER.get(getattr(value, "valueType", 1), "uiVal")
        return int(getattr(value.value, member))

    def _clocks_event_reasons(self, h) -> int:  # noqa: ANN001
        """nvmlDeviceGetCurrentClocksEventReasons (R535+ name), else the older ...ClocksThrottleReasons: absent
        from older bindings, and a driver older than the name answers FUNCTION_NOT_FOUND."""
        lib = self.lib
        new = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if new is not None:
            try:
                return new(h)
            except lib.NVMLError as e:
                if getattr(e, "value", None) != getattr(lib, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
                    raise
        return lib.nvmlDeviceGetCurrentClocksThrottleReasons(h)


def _nvml_text(value) -> str:  # noqa: ANN001 - str in newer bindings, bytes in older ones and in ctypes fields
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _nvml_scaled(value, divisor: float) -> float | None:  # noqa: ANN001
    return value / divisor if value is not None else None


def _nvml_error_record(index: int, static: dict, err: object) -> dict:
    """A GPU whose handle is gone: what is known of it, every reading None, and why."""
    rec = {"index": index, "uuid": static.get("uuid"), "name": static.get("name"),
           "pci_bus_id": static.get("pci_bus_id"), "error": f"{type(err).__name__}: {err}",
           "unsupported": [], "field_errors": {}}
    for key in ("memory_used_mib", "memory_total_mib", "utilization_pct", "power_w", "temperature_c", "power_limit_w",
                "persistence_mode", "ecc_uncorrected_volatile", "retired_pages_pending", "remapped_rows",
                "recovery_action", "recovery_action_code", "clocks_event_reasons"):
        rec[key] = None
    return rec
