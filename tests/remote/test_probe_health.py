"""The probe's GPU health readings: NVML through one reader (tests/harness/fakes/pynvml stands in for nvidia-ml-py),
nvidia-smi's health columns on new and old drivers (tests/harness/gpu/nvidia-smi), and the kernel log's Xid lines
(tests/harness/bin/dmesg). The probe as it travels (the agent archive's `probe` verb) runs once on each path."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.agentpyz import archive_path

from dflashctl.agent.probe import gpus as probe_gpus
from dflashctl.agent.probe.nvml import NvmlReader
from dflashctl.agent.probe.xid import xid_report
from dflashctl.analysis.gpus import from_nvml, parse_query_csv
from dflashctl.remote.probe import parse_frames

pytestmark = pytest.mark.timeout(60)

TESTS = Path(__file__).resolve().parents[1]
FAKES = TESTS / "harness" / "fakes"
SMI = TESTS / "harness" / "gpu" / "nvidia-smi"
HARNESS_BIN = TESTS / "harness" / "bin"
DATA = TESTS / "analysis" / "data" / "gpuhealth"
HEALTH_KEYS = {"pci_bus_id", "temperature_c", "power_limit_w", "persistence_mode", "ecc_uncorrected_volatile",
               "retired_pages_pending", "remapped_rows", "recovery_action", "clocks_event_reasons", "unsupported"}


@pytest.fixture
def nvml(monkeypatch):
    """The fake pynvml as `pynvml` (sys.modules), configured per test with .configure(scenario)."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKES / "pynvml" / "__init__.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """nvidia-smi (the stand-in) alone on PATH with python3; NVML unimportable, so the probe takes the smi path.
    Returns write(scenario) -> the call log path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(SMI)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    scenario, log = tmp_path / "gpus.json", tmp_path / "smi-calls.jsonl"
    monkeypatch.setenv("DFLASH_FAKE_GPUS", str(scenario))

    def write(doc: dict) -> Path:
        scenario.write_text(json.dumps({**doc, "call_log": str(log)}))
        return log
    return write


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def queried(call: list[str]) -> list[str]:
    return next(a for a in call if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")


# --- NVML ---


def test_nvml_records_carry_the_health_fields_as_typed_values(nvml):
    nvml.configure({"gpus": [
        {"memory_used_mib": 1024, "utilization_pct": 97, "power_w": 612.5, "temperature_c": 71,
         "power_limit_w": 650.0, "remapped_rows": [2, 1, 1, 0], "recovery_action": 0, "clocks_event_reasons": 0x4},
        {"bus_id": "00000000:3B:00.0", "persistence": False, "ecc_uncorrected_volatile": 3,
         "retired_pages_pending": True, "recovery_action": 1}]})
    with NvmlReader(nvml) as reader:
        first, second = reader.read()
    assert set(first) >= HEALTH_KEYS and first["error"] is None and first["unsupported"] == []
    assert (first["pci_bus_id"], first["temperature_c"], first["power_limit_w"]) == ("00000000:18:00.0", 71.0, 650.0)
    assert first["persistence_mode"] is True and first["ecc_uncorrected_volatile"] == 0
    assert first["remapped_rows"] == {"correctable": 2, "uncorrectable": 1, "pending": True, "failure": False}
    assert (first["recovery_action"], first["clocks_event_reasons"]) == ("none", 0x4)
    assert (first["memory_used_mib"], first["utilization_pct"], first["power_w"]) == (1024.0, 97.0, 612.5)
    assert isinstance(first["name"], str) and first["uuid"].startswith("GPU-")
    assert second["pci_bus_id"] == "00000000:3B:00.0" and second["persistence_mode"] is False
    assert (second["ecc_uncorrected_volatile"], second["retired_pages_pending"]) == (3, True)
    assert (second["recovery_action"], second["recovery_action_code"]) == ("reset", 1)
    samples = from_nvml([first, second])  # the laptop's reader takes the wider records as before
    assert [s.memory_used_mib for s in samples] == [1024.0, 0.0] and samples[0].power_w == 612.5


def test_what_nvml_cannot_tell_is_none_and_named(nvml):
    e = {"nvmlDeviceGetTemperature": nvml.NVML_ERROR_NOT_SUPPORTED,
         "nvmlDeviceGetRemappedRows": nvml.NVML_ERROR_NOT_SUPPORTED,
         "nvmlDeviceGetPersistenceMode": nvml.NVML_ERROR_NOT_FOUND,
         "nvmlDeviceGetTotalEccErrors": nvml.NVML_ERROR_NO_PERMISSION,
         "nvmlDeviceGetFieldValues": nvml.NVML_ERROR_UNKNOWN}
    nvml.configure({"gpus": [{"errors": e}]})
    with NvmlReader(nvml) as reader:
        (rec,) = reader.read()
    for key in ("temperature_c", "remapped_rows", "persistence_mode", "ecc_uncorrected_volatile", "recovery_action"):
        assert rec[key] is None, key
    assert set(rec["unsupported"]) == {"temperature_c", "remapped_rows", "persistence_mode",
                                       "ecc_uncorrected_volatile", "recovery_action"}
    assert rec["field_errors"] == {"ecc_uncorrected_volatile": "NVMLError_NoPermission: Insufficient Permissions",
                                   "recovery_action": "NVMLError_Unknown: Unknown Error"}
    assert rec["error"] is None and rec["memory_total_mib"] == 81559.0  # the rest still read


def test_one_init_and_one_set_of_handles_serve_every_read(nvml):
    nvml.configure({"gpus": [{}, {}, {}]})
    with NvmlReader(nvml) as reader:
        for _ in range(4):
            assert len(reader.read()) == 3
        assert reader.acquired == 1
    assert (nvml.CALLS["nvmlInit"], nvml.CALLS["nvmlDeviceGetHandleByIndex"], nvml.CALLS["nvmlShutdown"]) == (1, 3, 1)
    assert nvml.CALLS["nvmlDeviceGetName"] == 3 and nvml.CALLS["nvmlDeviceGetMemoryInfo"] == 12  # static once


def test_a_lost_gpu_is_a_row_and_its_handles_are_acquired_again(nvml):
    nvml.configure({"gpus": [{"uuid": "GPU-aaaa"}, {"uuid": "GPU-bbbb", "memory_used_mib": 5}]})
    reader = NvmlReader(nvml)
    reader.read()
    nvml.lose(1)
    ok, lost = reader.read()
    assert ok["error"] is None and ok["uuid"] == "GPU-aaaa"
    assert lost["error"] == "NVMLError_GpuIsLost: GPU is lost" and lost["uuid"] == "GPU-bbbb"  # known before
    assert lost["memory_used_mib"] is None and lost["recovery_action"] is None
    still = reader.read()[1]  # handles acquired again; the GPU is still gone
    assert still["error"].startswith("NVMLError_GpuIsLost") and reader.acquired == 2
    nvml.recover(1)  # reset: new handles, the old ones stay lost
    back = reader.read()[1]
    assert back["error"] is None and back["memory_used_mib"] == 5.0 and reader.acquired == 3
    reader.read()
    assert reader.acquired == 3 and nvml.CALLS["nvmlInit"] == 1
    reader.close()


def test_older_bindings_and_drivers(nvml):
    nvml.configure({"bindings": "old", "driver": 530, "gpus": [{"name": "Tesla V100-SXM2-32GB",
                                                                "clocks_event_reasons": 0x40}]})
    assert not hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
    with NvmlReader(nvml) as reader:
        (rec,) = reader.read()
    assert rec["name"] == "Tesla V100-SXM2-32GB"  # bytes decoded
    assert rec["clocks_event_reasons"] == 0x40 and nvml.CALLS["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    assert rec["recovery_action"] is None and "recovery_action" in rec["unsupported"]  # field unknown to R530
    assert rec["field_errors"] == {}
    nvml.configure({"driver": 440, "gpus": [{"clocks_event_reasons": 0x1}]})  # new bindings, pre-R535 driver
    with NvmlReader(nvml) as reader:
        (rec,) = reader.read()
    assert rec["clocks_event_reasons"] == 0x1 and nvml.CALLS["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    assert rec["remapped_rows"] is None and set(rec["unsupported"]) == {"remapped_rows", "recovery_action"}


@pytest.mark.parametrize(("code", "word"), [(0, "none"), (1, "reset"), (2, "reboot"), (3, "drain"), (4, "reset"),
                                            (5, None), (6, "reset"), (7, "reboot"), (42, None)])
def test_recovery_action_codes(nvml, code, word):
    nvml.configure({"gpus": [{"recovery_action": code}]})
    with NvmlReader(nvml) as reader:
        (rec,) = reader.read()
    assert (rec["recovery_action"], rec["recovery_action_code"]) == (word, code)


def test_gpu_report_prefers_nvml_and_falls_back_when_it_cannot_start(nvml, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either
    nvml.configure({"gpus": [{}]})
    rep = probe_gpus.gpu_report()
    assert rep["source"] == "nvml" and rep["smi_missing"] == [] and set(rep["nvml"][0]) >= HEALTH_KEYS
    assert nvml.CALLS["nvmlShutdown"] == 1  # a one-shot report closes its reader
    nvml.configure({"init_error": nvml.NVML_ERROR_DRIVER_NOT_LOADED, "gpus": [{}]})
    reader = probe_gpus.GpuReader()
    rep = probe_gpus.gpu_report(reader)
    assert rep["source"] is None and "NVMLError_DriverNotLoaded: Driver Not Loaded" in rep["error"]
    nvml._state["scn"]["init_error"] = None  # the driver came back: the same reader tries NVML again
    assert probe_gpus.gpu_report(reader)["source"] == "nvml"
    reader.close()
    nvml.configure({"init_error": nvml.NVML_ERROR_LIBRARY_NOT_FOUND, "gpus": [{}]})
    reader = probe_gpus.GpuReader()
    for _ in range(3):  # no libnvidia-ml at all: asked once, not every sample
        assert "NVMLError_LibraryNotFound" in probe_gpus.gpu_report(reader)["error"]
    assert nvml.CALLS["nvmlInit"] == 1


# --- nvidia-smi ---


def test_smi_sends_the_health_columns_as_printed(smi):
    log = smi({"frames": [[{"memory.used": 1000, "temperature.gpu": 64},
                           {"temperature.gpu": "[N/A]", "ecc.errors.uncorrected.volatile.total": "[Not Supported]",
                            "remapped_rows.pending": "Yes", "clocks_event_reasons.active": "0x0000000000000044",
                            "persistence_mode": "Disabled", "gpu_recovery_action": "Reset"}]]})
    rep = probe_gpus.gpu_report()
    assert rep["source"] == "nvidia-smi" and rep["smi_missing"] == [] and rep["error"] is None
    header, row0, row1 = rep["smi_csv"].splitlines()
    names = [c.split(" [")[0] for c in header.split(", ")]
    assert names == [*probe_gpus.SMI_QUERY.split(","), *probe_gpus.SMI_HEALTH]
    cells = dict(zip(names, row1.split(", "), strict=True))
    assert cells["temperature.gpu"] == "[N/A]" and cells["ecc.errors.uncorrected.volatile.total"] == "[Not Supported]"
    assert (cells["remapped_rows.pending"], cells["clocks_event_reasons.active"]) == ("Yes", "0x0000000000000044")
    assert (cells["persistence_mode"], cells["gpu_recovery_action"]) == ("Disabled", "Reset")
    assert dict(zip(names, row0.split(", "), strict=True))["retired_pages.pending"] == "[N/A]"  # H100: rows remap
    assert len(calls(log)) == 1
    (s0, s1) = parse_query_csv(rep["smi_csv"]).samples  # the laptop's parser reads the wider CSV as before
    assert (s0.memory_used_mib, s1.index, s0.power_w) == (1000.0, 1, 70.0)


def test_an_old_driver_is_asked_again_without_what_it_rejects_and_only_once(smi):
    log = smi({"driver": "470.256.02", "frames": [[{"clocks_throttle_reasons.active": "0x0000000000000004"}]]})
    reader = probe_gpus.GpuReader()
    rep = probe_gpus.gpu_report(reader)
    assert rep["source"] == "nvidia-smi", rep
    assert rep["smi_missing"] == ["remapped_rows.pending", "remapped_rows.failure", "clocks_event_reasons.active",
                                  "remapped_rows.correctable", "remapped_rows.uncorrectable", "gpu_recovery_action"]
    header, row = rep["smi_csv"].splitlines()
    cells = dict(zip([c.split(" [")[0] for c in header.split(", ")], row.split(", "), strict=True))
    assert cells["clocks_throttle_reasons.active"] == "0x0000000000000004"  # the old name instead
    first = len(calls(log))
    assert first == 7  # one rejection per call, as the real tool reports the first unknown field
    for _ in range(3):
        assert probe_gpus.gpu_report(reader)["smi_missing"] == rep["smi_missing"]
    later = calls(log)[first:]
    assert len(later) == 3 and all(queried(c) == queried(later[0]) for c in later)
    assert "gpu_recovery_action" not in queried(later[0])


def test_a_r530_driver_loses_only_the_newer_names(smi):
    smi({"driver": "530.41.03", "frames": [[{}]]})
    rep = probe_gpus.gpu_report()
    assert rep["smi_missing"] == ["clocks_event_reasons.active", "gpu_recovery_action"]
    assert "remapped_rows.pending" in rep["smi_csv"].splitlines()[0]


def test_a_broken_driver_is_still_the_error_it_was(smi):
    smi({"fail": {"code": 9}})
    rep = probe_gpus.gpu_report()
    assert rep["source"] is None and rep["error"].startswith("nvidia-smi exit 9: NVIDIA-SMI has failed")


# --- the probe as it travels ---


def _watch(argv: list[str], env: dict, count: int) -> list[dict]:
    proc = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdin.close()
    docs: list[dict] = []
    deadline = time.monotonic() + 30
    try:
        while len(docs) < count and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            docs += parse_frames(line)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert len(docs) == count, proc.stderr.read().decode()[-2000:]
    return docs


def test_the_watch_probe_keeps_one_nvml_reader(tmp_path):
    log = tmp_path / "nvml-calls"
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"gpus": [{"memory_used_mib": 7}, {"recovery_action": 2}],
                                    "call_log": str(log)}))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(FAKES), "DFLASH_FAKE_NVML": str(scenario)}
    docs = _watch(["-S", archive_path(), "probe", "--gpus", "--watch", "--interval", "0.1"], env, 4)
    for doc in docs:
        assert doc["gpus"]["source"] == "nvml" and len(doc["gpus"]["nvml"]) == 2
        assert set(doc["gpus"]["nvml"][0]) >= HEALTH_KEYS and doc["gpus"]["nvml"][1]["recovery_action"] == "reboot"
    names = log.read_text().split()
    assert names.count("nvmlInit") == 1 and names.count("nvmlDeviceGetHandleByIndex") == 2
    res = subprocess.run([sys.executable, "-S", archive_path(), "probe", "--gpus"], env=env, capture_output=True,
                         timeout=30)
    (doc,) = parse_frames(res.stdout)
    assert doc["gpus"]["nvml"][0]["memory_used_mib"] == 7.0
    names = log.read_text().split()
    assert names.count("nvmlInit") == 2 and names.count("nvmlShutdown") == 1  # the one-shot closed its own


def test_the_watch_probe_makes_one_nvidia_smi_call_per_reading_after_the_first(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(SMI)
    scenario, log = tmp_path / "gpus.json", tmp_path / "calls.jsonl"
    scenario.write_text(json.dumps({"driver": "530.41.03", "frames": [[{}, {}]], "call_log": str(log)}))
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}", "DFLASH_FAKE_GPUS": str(scenario)}
    docs = _watch(["-I", "-S", archive_path(), "probe", "--gpus", "--watch", "--interval", "0.1"], env, 4)  # no pynvml
    assert all(d["gpus"]["source"] == "nvidia-smi" for d in docs)
    assert docs[-1]["gpus"]["smi_missing"] == ["clocks_event_reasons.active", "gpu_recovery_action"]
    readings = sum(len(d.get("gpus_series") or [d["gpus"]]) for d in docs)
    made = calls(log)
    assert readings + 2 <= len(made) <= readings + 3  # 2 rejected calls first; perhaps one more in flight
    accepted = queried(made[2])
    assert all(queried(c) == accepted for c in made[2:]) and "clocks_throttle_reasons.active" in accepted


# --- Xid ---


def _kmsg_path(monkeypatch, tmp_path, lines: list[str] | None, extra_bin: Path | None = None) -> None:
    dirs = [str(extra_bin)] if extra_bin else []
    monkeypatch.setenv("PATH", ":".join([*dirs, str(HARNESS_BIN)]))
    monkeypatch.delenv("DFLASH_FAKE_KMSG_DENIED", raising=False)
    if lines is None:
        monkeypatch.delenv("DFLASH_FAKE_KMSG", raising=False)
    else:
        (tmp_path / "kmsg").write_text("".join(line + "\n" for line in lines))
        monkeypatch.setenv("DFLASH_FAKE_KMSG", str(tmp_path / "kmsg"))


def test_xid_lines_come_from_dmesg_raw_and_newest_last(monkeypatch, tmp_path):
    log = (DATA / "probe-xid-gpu-operator-1146.txt").read_text().splitlines()
    _kmsg_path(monkeypatch, tmp_path, log)
    rep = xid_report()
    assert rep == {"source": "dmesg", "lines": [line for line in log if "NVRM: Xid" in line], "error": None}
    assert [line.split("): ")[1][:2] for line in rep["lines"]] == ["48", "64"]
    many = [f"[{i}.000000] NVRM: Xid (PCI:0000:18:00): 13, pid={i}, name=python, Graphics Exception"
            for i in range(300)]
    _kmsg_path(monkeypatch, tmp_path, many)
    assert xid_report()["lines"] == many[-200:] and len(xid_report(max_lines=5)["lines"]) == 5


def test_no_xid_lines_and_no_kernel_log_are_both_empty(monkeypatch, tmp_path):
    _kmsg_path(monkeypatch, tmp_path, ["[    0.000000] Linux version 6.8.12-4-pve", "[    5.1] nvidia: loading"])
    assert xid_report() == {"source": "dmesg", "lines": [], "error": None}
    _kmsg_path(monkeypatch, tmp_path, None)  # the stand-in with nothing scripted: silent, exit 0
    assert xid_report() == {"source": "dmesg", "lines": [], "error": None}


def test_a_denied_dmesg_falls_back_to_the_journal(monkeypatch, tmp_path):
    journal = tmp_path / "jbin"
    journal.mkdir()
    (journal / "journalctl").write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" > {tmp_path}/journal-args\n'
        'printf "%s\\n" "2024-12-02T11:38:46+0000 pve kernel: NVRM: GPU 0000:0a:00.0: RmInitAdapter failed!"\n'
        'printf "%s\\n" "2024-12-02T11:38:47+0000 pve kernel: NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off '
        'the bus."\n')
    (journal / "journalctl").chmod(0o755)
    _kmsg_path(monkeypatch, tmp_path, ["NVRM: Xid (PCI:0000:07:00): 48, never read"], extra_bin=journal)
    monkeypatch.setenv("DFLASH_FAKE_KMSG_DENIED", "1")
    rep = xid_report()
    assert rep["source"] == "journalctl" and rep["error"] is None
    assert rep["lines"] == ["2024-12-02T11:38:47+0000 pve kernel: NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen "
                            "off the bus."]
    assert (tmp_path / "journal-args").read_text().split() == ["-k", "-o", "short-iso", "--no-pager"]


def test_a_denied_dmesg_without_a_journal_says_why(monkeypatch, tmp_path):
    _kmsg_path(monkeypatch, tmp_path, [])
    monkeypatch.setenv("DFLASH_FAKE_KMSG_DENIED", "1")
    rep = xid_report()
    assert rep["source"] is None and rep["lines"] == []
    assert rep["error"] == "dmesg: read kernel buffer failed: Operation not permitted; journalctl: not found"


def test_a_busybox_dmesg_is_asked_plainly(monkeypatch, tmp_path):
    line = "[  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE"
    _kmsg_path(monkeypatch, tmp_path, [line])
    monkeypatch.setenv("DFLASH_FAKE_DMESG_BUSYBOX", "1")
    assert xid_report() == {"source": "dmesg", "lines": [line], "error": None}


def test_the_probe_reports_xid_lines_with_its_flag(tmp_path):
    lines = (DATA / "probe-xid-nvforum-371272.txt").read_text().splitlines()
    (tmp_path / "kmsg").write_text("\n".join(lines) + "\n")
    env = {"PATH": f"{HARNESS_BIN}:{Path(sys.executable).parent}", "DFLASH_FAKE_KMSG": str(tmp_path / "kmsg")}
    res = subprocess.run([sys.executable, "-I", "-S", archive_path(), "probe", "--xid"], env=env,
                         capture_output=True, timeout=30)
    (doc,) = parse_frames(res.stdout)
    assert doc["xid"] == {"source": "dmesg", "lines": [line for line in lines if "Xid" in line], "error": None}
    assert "gpus" not in doc


def test_the_fake_pynvml_mirrors_the_real_bindings(nvml):
    """Every name the fake defines exists in nvidia-ml-py with the same value (constants), kind (functions) and
    error class; the reader uses nothing the real bindings lack."""
    real = _real_pynvml()
    for name in dir(nvml):
        if not (name.startswith(("nvml", "NVML", "NVMLError")) and name[4:5] != "_"):
            continue
        assert hasattr(real, name), name
        mine, theirs = getattr(nvml, name), getattr(real, name)
        if isinstance(mine, int):
            assert mine == theirs, name
        elif callable(mine) and not isinstance(mine, type):
            assert callable(theirs), name
    for code in (3, 6, 13, 15):
        assert type(nvml.NVMLError(code)).__name__ == type(real.NVMLError(code)).__name__
        assert str(nvml.NVMLError(code)) == str(real.NVMLError(code))
    source = Path(sys.modules[NvmlReader.__module__].__file__).read_text()
    used = set(re.findall(r"lib\.(nvml\w+)", source)) | set(re.findall(r'"((?:nvml|NVML_)\w+)"', source))
    fields = {f[0] for f in real.c_nvmlFieldValue_t._fields_}  # nvmlReturn: a member of a field value
    assert len(used) > 20 and sorted(n for n in used if not hasattr(real, n) and n not in fields) == []


def _real_pynvml():
    path = next((Path(p) / "pynvml.py" for p in sys.path if (Path(p) / "pynvml.py").is_file()), None)
    if path is None:
        pytest.skip("nvidia-ml-py is not installed")
    spec = importlib.util.spec_from_file_location("pynvml_real", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pynvml_real"] = mod  # its error classes are built from sys.modules[__name__]
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules["pynvml_real"]
    return mod
