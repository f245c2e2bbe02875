"""The probe's GPU samples, NVML when importable and working, else nvidia-smi CSV, else none.

The CSV crosses as nvidia-smi printed it, header included, so the laptop's one parser (analysis/gpus.py) reads
the columns by name rather than by position."""

from __future__ import annotations

import subprocess

SMI_QUERY = "index,uuid,name,memory.used,memory.total,utilization.gpu,power.draw"


def gpu_report() -> dict:
    nvml_error = None
    try:
        return {"source": "nvml", "nvml": _nvml(), "smi_csv": None, "error": None}
    except Exception as e:  # ImportError, NVMLError (no driver), anything: fall back to nvidia-smi
        nvml_error = f"{type(e).__name__}: {e}"
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=" + SMI_QUERY, "--format=csv,nounits"],  # with its header: it names the columns
            stdin=subprocess.DEVNULL, capture_output=True, timeout=20,
        )
    except FileNotFoundError:
        return {"source": None, "nvml": [], "smi_csv": None,
                "error": f"no GPUs visible: nvidia-smi not found ({nvml_error})"}
    except subprocess.TimeoutExpired:
        return {"source": None, "nvml": [], "smi_csv": None, "error": "nvidia-smi timed out after 20s"}
    if res.returncode != 0:
        msg = " | ".join((res.stderr or res.stdout).decode("utf-8", "replace").strip().splitlines()[-3:])
        return {"source": None, "nvml": [], "smi_csv": None, "error": f"nvidia-smi exit {res.returncode}: {msg}"}
    return {"source": "nvidia-smi", "nvml": [], "smi_csv": res.stdout.decode("utf-8", "replace"), "error": None}


def _nvml() -> list:
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            try:
                util = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except pynvml.NVMLError:
                util = None
            try:
                power = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            except pynvml.NVMLError:
                power = None
            out.append({
                "index": i,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_used_mib": mem.used / 1048576.0,
                "memory_total_mib": mem.total / 1048576.0,
                "utilization_pct": util,
                "power_w": power,
            })
        return out
    finally:
        pynvml.nvmlShutdown()
