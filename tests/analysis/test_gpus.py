"""nvidia-smi parsing on the real formats: the seed's rows, every --format variant, placeholders, NVML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.analysis.gpus import (
    PROBE_FIELDS,
    GpuParseError,
    from_nvml,
    parse_nvidia_smi,
    sweeps,
)

DATA = Path(__file__).parent / "data"
STANDIN = Path(__file__).resolve().parents[1] / "harness" / "gpu" / "nvidia-smi"


def test_seed_rows_parse_to_eight_samples() -> None:
    r = parse_nvidia_smi((DATA / "seed_nvidia_smi.csv").read_text())
    assert [s.index for s in r.samples] == list(range(8))
    assert [s.memory_used_mib for s in r.samples] == [88283, 96779, 88443, 96905, 76779, 46901, 48861, 47421]
    assert all(s.utilization_pct == 0 for s in r.samples)
    assert all(s.memory_total_mib is None and s.power_w is None for s in r.samples)


def _standin(tmp_path: Path, gpus: list[dict], *args: str, processes: list[dict] | None = None) -> str:
    """The harness's nvidia-smi stand-in prints the real formats for scripted GPUs."""
    import json
    import os

    scn = tmp_path / "gpus.json"
    scn.write_text(json.dumps({"frames": [gpus], "processes": processes or []}))
    out = subprocess.run([sys.executable, str(STANDIN), *args], capture_output=True, text=True, check=True,
                         env={**os.environ, "DFLASH_FAKE_GPUS": str(scn)})
    return out.stdout


GPUS = [{"memory.used": 88283, "utilization.gpu": 0, "power.draw": None},
        {"memory.used": 512, "utilization.gpu": 97, "power.draw": 612.5}]


@pytest.mark.parametrize("fmt", ["csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"])
def test_every_csv_format_variant_gives_the_same_samples(tmp_path: Path, fmt: str) -> None:
    text = _standin(tmp_path, GPUS, "--query-gpu=" + ",".join(PROBE_FIELDS), f"--format={fmt}")
    s = parse_nvidia_smi(text).samples
    assert [(x.index, x.memory_used_mib, x.memory_total_mib, x.utilization_pct, x.power_w) for x in s] == [
        (0, 88283, 81559, 0, None), (1, 512, 81559, 97, 612.5)]
    assert s[0].uuid.startswith("GPU-") and s[0].name == "NVIDIA H100 80GB HBM3"


def test_headerless_nounits_rows_need_the_field_list_when_ambiguous(tmp_path: Path) -> None:
    text = _standin(tmp_path, GPUS, "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits")
    s = parse_nvidia_smi(text, fields=["index", "utilization.gpu", "memory.used"]).samples
    assert [(x.memory_used_mib, x.utilization_pct) for x in s] == [(88283, 0), (512, 97)]


def test_timestamped_loop_output_splits_into_sweeps(tmp_path: Path) -> None:
    one = _standin(tmp_path, GPUS, "--query-gpu=timestamp,index,memory.used,utilization.gpu", "--format=csv")
    text = one + one.split("\n", 1)[1]  # `-l` repeats the rows (header once)
    samples = parse_nvidia_smi(text).samples
    assert len(samples) == 4 and samples[0].timestamp is not None
    assert [[s.index for s in sw] for sw in sweeps(samples)] == [[0, 1], [0, 1]]


def test_compute_apps_rows_become_processes(tmp_path: Path) -> None:
    text = _standin(tmp_path, GPUS, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv",
                    processes=[{"pid": 91451, "used_memory": 47000, "gpu": 1}])
    r = parse_nvidia_smi(text)
    assert r.samples == ()
    assert [(p.pid, p.used_memory_mib) for p in r.processes] == [(91451, 47000)]
    assert r.processes[0].gpu_uuid.startswith("GPU-00000001")


def test_plain_table_output_is_understood(tmp_path: Path) -> None:
    r = parse_nvidia_smi(_standin(tmp_path, GPUS))
    assert [(s.index, s.memory_used_mib, s.memory_total_mib, s.utilization_pct) for s in r.samples] == [
        (0, 88283, 81559, 0), (1, 512, 81559, 97)]


def test_real_driver_table_two_line_layout() -> None:
    text = """\
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:18:00.0 Off |                    0 |
| N/A   34C    P0            118W /  700W |   88283MiB / 143771MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
|   1  NVIDIA H200                    On  |   00000000:2A:00.0 Off |                    0 |
| N/A   36C    P0            652W /  700W |   96779MiB / 143771MiB |     99%      Default |
"""
    s = parse_nvidia_smi(text).samples
    assert [(x.index, x.name, x.memory_used_mib, x.utilization_pct, x.power_w) for x in s] == [
        (0, "NVIDIA H200", 88283, 0, 118), (1, "NVIDIA H200", 96779, 99, 652)]


@pytest.mark.parametrize("placeholder", ["[N/A]", "[Not Supported]", "[Unknown Error]", "[GPU is lost]", "N/A"])
def test_placeholders_are_not_available_never_errors(placeholder: str) -> None:
    text = f"index, memory.used [MiB], utilization.gpu [%], power.draw [W]\n0, 100 MiB, {placeholder}, {placeholder}\n"
    s = parse_nvidia_smi(text).samples[0]
    assert s.utilization_pct is None and s.power_w is None and s.memory_used_mib == 100


def test_no_devices_is_an_empty_reading_and_driver_failure_is_an_error() -> None:
    assert parse_nvidia_smi("No devices were found\n").samples == ()
    with pytest.raises(GpuParseError, match="driver"):
        parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure")


def test_text_that_is_not_nvidia_smi_is_rejected_in_one_line() -> None:
    with pytest.raises(GpuParseError):
        parse_nvidia_smi("hello world\nthis is a log\n")


def test_nvml_dicts() -> None:
    s = from_nvml([{"index": 3, "uuid": "GPU-x", "name": "H200", "memory_used_mib": 47421.0,
                    "memory_total_mib": 143771.0, "utilization_pct": 0, "power_w": None}], timestamp=5.0)
    assert s[0].index == 3 and s[0].utilization_pct == 0 and s[0].power_w is None and s[0].timestamp == 5.0
