"""Which GPUs --exclude-unhealthy-gpus leaves out, on real nvidia-smi outputs (tests/analysis/data/gpuhealth)."""

from __future__ import annotations

from pathlib import Path

from dflashctl.analysis.gpuexclude import exclusion
from dflashctl.analysis.gpuhealth import gpu_health, health_findings
from dflashctl.analysis.xids import xid_events
from dflashctl.model import GpuReport

DATA = Path(__file__).parent / "data" / "gpuhealth"


def _findings(name: str, source: str = "nvidia-smi"):  # noqa: ANN202
    return health_findings(gpu_health(GpuReport(source, smi_csv=(DATA / name).read_text())))


def test_uncorrectable_ecc_and_pending_remaps_are_left_out_slowdowns_are_not() -> None:
    ex = exclusion((0, 1, 2, 3), _findings("smi-reconstructed-a100x4-probe-query.csv"))
    assert ex.keep == (0, 1, 3)  # GPU 0 power-capped, GPU 1 thermal, GPU 3 persistence off: all kept
    assert [w.split(":")[0] for w in ex.left_out[2]] == ["ecc-uncorrected", "row-remap-pending"]
    assert ex.why().startswith("GPU 2 (ecc-uncorrected: ecc.errors.uncorrected.volatile.total=1, row-remap-pending")


def test_the_left_out_sentence_names_each_gpu_and_what_the_run_gets_and_is_empty_when_none_was() -> None:
    ex = exclusion((0, 1, 2, 3), _findings("smi-reconstructed-a100x4-probe-query.csv"))
    assert ex.note("the program") == f"left out {ex.why()}; the program gets CUDA_VISIBLE_DEVICES=0,1,3"
    assert ex.note().endswith("; the attempt gets CUDA_VISIBLE_DEVICES=0,1,3")
    assert exclusion((0, 1), _findings("smi-reconstructed-a100x4-probe-query.csv")).note() == ""


def test_a_remap_pending_in_nvidia_smi_q_is_left_out() -> None:
    ex = exclusion((0,), _findings("q-510.73.08-a100-remap-pending.txt", "nvidia-smi-q"))
    assert ex.keep == () and list(ex.left_out) == [0]


def test_only_the_gpus_asked_about_are_judged() -> None:
    ex = exclusion((0, 1), _findings("smi-reconstructed-a100x4-probe-query.csv"))
    assert ex.keep == (0, 1) and ex.left_out == {}


def test_a_fallen_off_the_bus_xid_leaves_its_gpu_out() -> None:
    csv = (DATA / "smi-reconstructed-a100x4-probe-query.csv").read_text()
    healths = gpu_health(GpuReport("nvidia-smi", smi_csv=csv))
    pci = healths[1].pci_bus_id
    events = xid_events(f"NVRM: Xid (PCI:{pci}): 79, pid=1234, GPU has fallen off the bus.\n")
    ex = exclusion((0, 1), health_findings(healths, events))
    assert ex.keep == (0,) and ex.left_out[1][0].startswith("xid-79")
