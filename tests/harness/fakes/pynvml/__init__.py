"""A stand-in for nvidia-ml-py's `pynvml` (tests only): the real module's names, constants, return types and
exception classes, answering from a scripted set of GPUs instead of libnvidia-ml.

Mirrors nvidia-ml-py 13.x (`pynvml.py`): NVMLError(value) returns the subclass NVMLError_<CamelName> (built from
the NVML_ERROR_* names as the real _extractNVMLErrorsAsClasses does) and str() of it is the real text; device
calls before nvmlInit (or after the last nvmlShutdown) raise NVMLError_Uninitialized; nvmlDeviceGetName/UUID
return str, or bytes with `bindings: "old"`; nvmlDeviceGetPciInfo's busId is bytes (a ctypes char array); a
function the "driver" lacks raises NVMLError_FunctionNotFound (what the real binding does when the symbol is
missing); field values answer per field (nvmlReturn), NOT_SUPPORTED for ids the driver does not know.

Scenario (configure(dict), or the JSON file named by $DFLASH_FAKE_NVML, read at import):
  {"gpus": [gpu, ...],
   "bindings": "new" | "old",   # old: names/UUIDs are bytes; no nvmlDeviceGetCurrentClocksEventReasons, no
                                # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvidia-ml-py before 12.535 / 12.560)
   "driver": 590,               # its major: <535 lacks ...ClocksEventReasons, <450 lacks ...RemappedRows,
                                # <560 answers the recovery-action field NOT_SUPPORTED
   "init_error": 9,             # nvmlInit raises this NVML_ERROR_* value (9: driver not loaded)
   "call_log": "/path"}         # every call appends its function name as one line (subprocess tests)
gpu: {"name", "uuid", "bus_id", "memory_total_mib", "memory_used_mib", "utilization_pct", "power_w",
      "temperature_c", "power_limit_w", "persistence": bool, "ecc_uncorrected_volatile", "retired_pages_pending":
      bool, "remapped_rows": [correctable, uncorrectable, pending, failure], "recovery_action": int,
      "clocks_event_reasons": int, "errors": {function name: NVML_ERROR_* value}, "lost": bool}
In-process: CALLS counts calls by function name; lose(i) / recover(i) make GPU i fall off the bus and come back
(a recovered GPU has new handles: the old ones stay lost).
"""

from __future__ import annotations

import collections
import json
import os
import string
import sys

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_GPU_RECOVERY_ACTION_NONE = 0
NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
NVML_GPU_RECOVERY_ACTION_NODE_REBOOT = 2
NVML_GPU_RECOVERY_ACTION_DRAIN_P2P = 3
NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET = 4
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
_RECOVERY_FIELD = 230  # the field id itself, which old bindings lack a name for
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksThrottleReasonGpuIdle = 0x1
nvmlClocksThrottleReasonSwPowerCap = 0x4


class NVMLError(Exception):
    _valClassMapping: dict = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized", NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size", NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue", NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found", NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost", NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory", NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value):  # the real signature
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    __hash__ = Exception.__hash__


def _extractNVMLErrorsAsClasses() -> None:  # the real name
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):  # noqa: ANN001, ANN202
            def new(typ, *args):  # noqa: ANN001, ANN002, ANN202
                return NVMLError.__new__(typ, val)
            return new
        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


class _Struct:
    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)


class c_nvmlDevice_t:  # the real name
    def __init__(self, index: int, generation: int) -> None:
        self.index, self.generation = index, generation


CALLS: collections.Counter = collections.Counter()
_NEW_ONLY = {"nvmlDeviceGetCurrentClocksEventReasons": None, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": None}
_state: dict = {"scn": {"gpus": []}, "refs": 0, "gen": {}}


def configure(scenario: dict) -> None:
    """Start over with this scenario (counters cleared, NVML not initialised)."""
    module = sys.modules[__name__]
    for name in _NEW_ONLY:
        if _NEW_ONLY[name] is None and hasattr(module, name):
            _NEW_ONLY[name] = getattr(module, name)
        if scenario.get("bindings") == "old":
            if hasattr(module, name):
                delattr(module, name)
        else:
            setattr(module, name, _NEW_ONLY[name])
    _state.update(scn=dict(scenario), refs=0, gen={})
    CALLS.clear()


def lose(index: int) -> None:
    _state["scn"]["gpus"][index]["lost"] = True


def recover(index: int) -> None:
    _state["scn"]["gpus"][index]["lost"] = False
    _state["gen"][index] = _state["gen"].get(index, 0) + 1


def _called(name: str) -> None:
    CALLS[name] += 1
    log = _state["scn"].get("call_log")
    if log:
        with open(log, "a") as f:
            f.write(name + "\n")


def _driver() -> int:
    return int(_state["scn"].get("driver", 590))


def _gpu(name: str, handle: c_nvmlDevice_t) -> dict:
    """The scripted GPU behind a handle, after the checks every device call makes."""
    _called(name)
    if _state["refs"] <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    gpus = _state["scn"].get("gpus") or []
    if not isinstance(handle, c_nvmlDevice_t) or handle.index >= len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = gpus[handle.index]
    if gpu.get("lost") or handle.generation != _state["gen"].get(handle.index, 0):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    code = (gpu.get("errors") or {}).get(name)
    if code is not None:
        raise NVMLError(int(code))
    return gpu


def _text(value: str) -> str | bytes:
    return value.encode() if _state["scn"].get("bindings") == "old" else value


def nvmlInitWithFlags(flags: int) -> None:
    _called("nvmlInit")
    code = _state["scn"].get("init_error")
    if code is not None:
        raise NVMLError(int(code))
    _state["refs"] += 1


def nvmlInit() -> None:
    nvmlInitWithFlags(0)


def nvmlShutdown() -> None:
    _called("nvmlShutdown")
    if _state["refs"] <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _state["refs"] -= 1


def nvmlSystemGetDriverVersion() -> str | bytes:
    _called("nvmlSystemGetDriverVersion")
    return _text(f"{_driver()}.00.00")


def nvmlDeviceGetCount() -> int:
    _called("nvmlDeviceGetCount")
    if _state["refs"] <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return len(_state["scn"].get("gpus") or [])


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    _called("nvmlDeviceGetHandleByIndex")
    if _state["refs"] <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    gpus = _state["scn"].get("gpus") or []
    if index >= len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if gpus[index].get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return c_nvmlDevice_t(index, _state["gen"].get(index, 0))


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str | bytes:
    return _text(_gpu("nvmlDeviceGetName", handle).get("name", "NVIDIA H100 80GB HBM3"))


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str | bytes:
    return _text(_gpu("nvmlDeviceGetUUID", handle).get("uuid", f"GPU-{handle.index:08x}-0000-4000-8000-000000000000"))


def nvmlDeviceGetPciInfo_v3(handle: c_nvmlDevice_t) -> _Struct:
    bus = _gpu("nvmlDeviceGetPciInfo", handle).get("bus_id", f"00000000:{0x18 + handle.index:02X}:00.0")
    legacy = bus[4:] if len(bus) == 16 else bus
    return _Struct(busIdLegacy=legacy.encode(), busId=bus.encode(), domain=int(bus.split(":")[0], 16),
                   bus=int(bus.split(":")[1], 16), device=int(bus.split(":")[2].split(".")[0], 16),
                   pciDeviceId=0x233010DE, pciSubSystemId=0x16C110DE)


def nvmlDeviceGetPciInfo(handle: c_nvmlDevice_t) -> _Struct:
    return nvmlDeviceGetPciInfo_v3(handle)


def nvmlDeviceGetMemoryInfo(handle: c_nvmlDevice_t, version: object = None) -> _Struct:
    gpu = _gpu("nvmlDeviceGetMemoryInfo", handle)
    total, used = int(gpu.get("memory_total_mib", 81559) * 1048576), int(gpu.get("memory_used_mib", 0) * 1048576)
    return _Struct(total=total, free=total - used, used=used)


def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> _Struct:
    gpu = _gpu("nvmlDeviceGetUtilizationRates", handle)
    return _Struct(gpu=int(gpu.get("utilization_pct", 0)), memory=0)


def nvmlDeviceGetPowerUsage(handle: c_nvmlDevice_t) -> int:  # milliwatts
    return int(_gpu("nvmlDeviceGetPowerUsage", handle).get("power_w", 70.0) * 1000)


def nvmlDeviceGetTemperature(handle: c_nvmlDevice_t, sensor: int) -> int:
    return int(_gpu("nvmlDeviceGetTemperature", handle).get("temperature_c", 30))


def nvmlDeviceGetEnforcedPowerLimit(handle: c_nvmlDevice_t) -> int:  # milliwatts
    return int(_gpu("nvmlDeviceGetEnforcedPowerLimit", handle).get("power_limit_w", 700.0) * 1000)


def nvmlDeviceGetPersistenceMode(handle: c_nvmlDevice_t) -> int:
    on = _gpu("nvmlDeviceGetPersistenceMode", handle).get("persistence", True)
    return NVML_FEATURE_ENABLED if on else NVML_FEATURE_DISABLED


def nvmlDeviceGetTotalEccErrors(handle: c_nvmlDevice_t, errorType: int, counterType: int) -> int:
    gpu = _gpu("nvmlDeviceGetTotalEccErrors", handle)
    if (errorType, counterType) != (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC):
        return 0
    return int(gpu.get("ecc_uncorrected_volatile", 0))


def nvmlDeviceGetRetiredPagesPendingStatus(device: c_nvmlDevice_t) -> int:
    pending = _gpu("nvmlDeviceGetRetiredPagesPendingStatus", device).get("retired_pages_pending", False)
    return int(NVML_FEATURE_ENABLED if pending else NVML_FEATURE_DISABLED)


def nvmlDeviceGetRemappedRows(device: c_nvmlDevice_t) -> tuple[int, int, int, int]:
    gpu = _gpu("nvmlDeviceGetRemappedRows", device)
    if _driver() < 450:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    c, u, p, f = gpu.get("remapped_rows", [0, 0, 0, 0])
    return int(c), int(u), int(bool(p)), int(bool(f))


def nvmlDeviceGetFieldValues(handle: c_nvmlDevice_t, fieldIds: list) -> list:
    gpu = _gpu("nvmlDeviceGetFieldValues", handle)
    out = []
    for fid in fieldIds:
        fid = fid[0] if isinstance(fid, tuple) else fid
        known = fid == _RECOVERY_FIELD and _driver() >= 560
        value = _Struct(dVal=0.0, uiVal=int(gpu.get("recovery_action", 0)) if known else 0, ulVal=0, ullVal=0,
                        sllVal=0, siVal=0, usVal=0)
        out.append(_Struct(fieldId=fid, scopeId=0, timestamp=0, latencyUsec=0, valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                           nvmlReturn=NVML_SUCCESS if known else NVML_ERROR_NOT_SUPPORTED, value=value))
    return out


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: c_nvmlDevice_t) -> int:
    return int(_gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).get("clocks_event_reasons", 0))


def nvmlDeviceGetCurrentClocksEventReasons(handle: c_nvmlDevice_t) -> int:
    gpu = _gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if _driver() < 535:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return int(gpu.get("clocks_event_reasons", 0))


if os.environ.get("DFLASH_FAKE_NVML"):
    with open(os.environ["DFLASH_FAKE_NVML"]) as _f:
        configure(json.load(_f))
