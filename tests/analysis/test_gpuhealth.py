"""GPU health on recorded inputs: real kernel Xid lines and nvidia-smi CSV of two driver generations, NVML dicts as the
probe sends them; the findings they give (data/gpuhealth/README.md says where each file comes from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashctl.analysis.gpuhealth import (
    FINDINGS,
    decode_reasons,
    gpu_health,
    health_findings,
    pci_index,
    worst_action,
)
from dflashctl.analysis.smiq import THROTTLE_BITS
from dflashctl.analysis.xids import XID_TABLE, normalize_pci, parse_xid_line, xid_events, xid_info
from dflashctl.model import GpuAction, GpuHealth, GpuReport, HealthSeverity

DATA = Path(__file__).parent / "data" / "gpuhealth"
ROOT = Path(__file__).resolve().parents[2]
REQUIRED_XIDS = {13, 31, 43, 45, 48, 63, 64, 74, 79, 94, 95, 119, 120}


def smi(name: str) -> list[GpuHealth]:
    return gpu_health(GpuReport("nvidia-smi", smi_csv=(DATA / name).read_text()))


def events(name: str) -> list[tuple[int, str | None]]:
    return [(e.xid, e.pci) for e in xid_events((DATA / name).read_text())]


# -- Xid lines -------------------------------------------------------------------------------------------------------

EXPECTED_XIDS = {
    "xid-akash-support-244.txt": [(43, "0000:00:05"), (43, "0000:00:05"), (31, "0000:00:07"), (94, "0000:00:08")],
    "xid-gpud-pr46.txt": [(13, "0000:cb:00")] * 3 + [(109, "0000:cb:00")],
    "xid-relion-436.txt": [(13, "0000:41:00")] * 3,
    "xid-dxvk-1027.txt": [(31, "0000:01:00"), (13, "0000:01:00"), (32, "0000:01:00")],
    "xid-nvidia-docker-849.txt": [(48, "0000:8a:00"), (63, "0000:8a:00")],
    "xid-ml-engineering-debug.txt": [(63, "0000:10:1c")],
    "xid-gpud-119.log": [(119, "0000:9b:00")] * 5,
    "xid-ogkm-446.txt": [(119, "0000:61:00")] * 2,
    "xid-nvforum-364958.txt": [(120, "0000:01:00"), (154, "0000:01:00"), (62, "0000:01:00"), (154, "0000:01:00"),
                               (45, "0000:01:00")],
    "xid-ogkm-1150.txt": [(45, "0000:dc:00"), (45, "0000:ed:00"), (45, "0000:ba:00")],
    "xid-nvsentinel-155.txt": [(79, "0000:b3:00"), (79, "0000:44:00")],
    "xid-pastebin-xJaypMZt.txt": [(79, "0000:01:00"), (3, "0000:01:00")],
    "xid-reconstructed.txt": [(79, "0000:18:00"), (48, "0000:3b:00"), (64, "0000:3b:00"), (74, "0000:5d:00"),
                              (95, "0000:b1:00"), (94, "0000:b1:00"), (119, "0000:ca:00"), (13, "0000:18:00")],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_XIDS))
def test_collected_kernel_logs_give_each_xid_with_its_gpu_address_and_nothing_else(name: str) -> None:
    assert events(name) == EXPECTED_XIDS[name]


def test_every_collected_log_file_is_checked() -> None:
    assert {p.name for p in DATA.glob("xid-*")} == set(EXPECTED_XIDS)


def test_the_collected_lines_cover_every_xid_the_table_must_know() -> None:
    seen = {x for lines in EXPECTED_XIDS.values() for x, _ in lines}
    assert seen >= REQUIRED_XIDS
    assert set(XID_TABLE) >= REQUIRED_XIDS


def test_pid_and_process_are_read_when_the_driver_printed_them() -> None:
    e = parse_xid_line("[Mon Aug  5 03:54:13 2024] NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, "
                       "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ "
                       "0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE")
    assert e is not None
    assert (e.xid, e.pci, e.pid, e.process) == (31, "0000:00:07", 2512125, "python3.10")
    assert e.message.startswith("Ch 00000008, intr 00000000. MMU Fault")


def test_unknown_pid_and_name_are_none_and_not_part_of_the_message() -> None:
    e = xid_events((DATA / "xid-akash-support-244.txt").read_text())[-1]
    assert (e.xid, e.pid, e.process) == (94, None, None)
    assert e.message == "Contained: SM (0x1). RST: No, D-RST: No"


def test_a_pid_without_a_name_and_names_with_colons_are_read() -> None:
    (e,) = xid_events((DATA / "xid-ml-engineering-debug.txt").read_text())
    assert (e.pid, e.process, e.message) == (1896, None, "Row Remapper: New row marked for remapping, reset gpu to "
                                                        "activate.")
    worker = xid_events((DATA / "xid-nvforum-364958.txt").read_text())[-1]
    assert (worker.pid, worker.process, worker.message) == (12542, "VLLM::Worker", "channel 0x00000002")


def test_reports_after_a_dmesg_iso_or_journal_short_iso_prefix_are_read() -> None:
    iso = parse_xid_line("2024-08-09T13:32:56,123456+00:00 NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', "
                         "name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No")
    journal = xid_events((DATA / "xid-reconstructed.txt").read_text())[1]
    assert iso is not None and (iso.xid, iso.pci) == (94, "0000:00:08")
    assert (journal.xid, journal.pid) == (48, None)


def test_lines_without_pid_keep_the_whole_message() -> None:
    e = xid_events((DATA / "xid-relion-436.txt").read_text())[1]
    assert (e.pid, e.process) == (None, None)
    assert e.message == "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Illegal Instruction Encoding"


@pytest.mark.parametrize("text, want", [
    ("00000000:18:00.0", "0000:18:00"),  # nvidia-smi pci.bus_id, NVML busId
    ("0000:18:00.0", "0000:18:00"),
    ("PCI:0000:18:00", "0000:18:00"),  # kernel line
    ("0000:18:00", "0000:18:00"),  # old kernel line
    ("00000000:3B:00.0", "0000:3b:00"),  # upper-case hex
    ("00000009:01:00.0", "0009:01:00"),  # Grace systems use non-zero domains
    ("PCI:0019:01:00", "0019:01:00"),
    ("0003:00", "0000:03:00"),  # the very old `Xid (0003:00)`
    ("not an address", None), ("", None), (None, None), ("0000:1ff:00", None),
])
def test_pci_addresses_of_every_spelling_normalise_to_one(text: str | None, want: str | None) -> None:
    assert normalize_pci(text) == want


@pytest.mark.parametrize("line", [
    "[31543.449440] NVRM: GPU at PCI:0000:01:00: GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d",
    "nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 11001, Fatal, ingress invalid command",
    "Oct 15 12:40:10 server kernel: NVRM: Xid (43, pid: 5678): ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
    "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
])
def test_lines_that_are_not_xid_reports_give_no_event(line: str) -> None:
    assert parse_xid_line(line) is None


def test_fallen_off_the_bus_without_an_xid_counts_as_xid_79() -> None:
    one_line, split, quoted = (xid_events((DATA / name).read_text())[0] for name in
                               ("xid-pastebin-xJaypMZt.txt", "xid-nvsentinel-155.txt", "xid-nvsentinel-155.txt"))
    assert (one_line.xid, one_line.pci) == (79, "0000:01:00")
    assert (split.xid, split.pci) == (79, "0000:b3:00")
    assert "fallen off the bus" in split.raw.splitlines()[-1]


def test_a_split_message_whose_end_is_too_far_away_is_not_an_event() -> None:
    lines = ["NVRM: The NVIDIA GPU 0000:b3:00.0", "a", "b", "c", "d", "NVRM: fallen off the bus and is not responding"]
    assert xid_events(lines) == []


def test_the_table_uses_only_the_action_vocabulary_and_unknown_xids_get_a_generic_row() -> None:
    assert all(i.action is None or i.action in GpuAction for i in XID_TABLE.values())
    assert {c: XID_TABLE[c].action for c in (79, 48, 94, 95, 13)} == {
        79: GpuAction.REBOOT, 48: GpuAction.RESET_GPU, 94: GpuAction.RESTART_PROGRAM, 95: GpuAction.RESET_GPU,
        13: GpuAction.RESTART_PROGRAM}
    generic = xid_info(109)
    assert (generic.code, generic.action, generic.severity) == (109, None, HealthSeverity.WARNING)
    assert "Xid catalog" in generic.remedy


# -- nvidia-smi and NVML readings ------------------------------------------------------------------------------------

def test_r471_csv_reads_the_throttle_naming_and_leaves_what_the_driver_lacks_none() -> None:
    (h,) = smi("smi-471.11-rtx2080super-all-fields.csv")
    assert (h.index, h.pci_bus_id, h.name) == (0, "0000:0c:00", "NVIDIA GeForce RTX 2080 SUPER")
    assert (h.temperature_c, h.power_w, h.power_limit_w) == (36, 32.7, 250)
    assert (h.clocks_event_reasons, h.throttle_reasons) == (0x1, ("gpu_idle",))
    assert h.persistence_mode is h.ecc_uncorrected_volatile is h.retired_pages_pending is None  # [N/A] on WDDM
    assert h.remapped_rows_pending is h.remapped_rows_failure is None  # no such columns before Ampere drivers
    assert health_findings([h]) == []


def test_r570_csv_prints_event_reason_headers_and_reads_like_the_old_names() -> None:
    power = smi("smi-570.172.08-rtxpro6000-power.csv")
    throttle = smi("smi-570.172.08-rtxpro6000-throttle.csv")
    assert [(h.index, h.temperature_c, h.power_w, h.power_limit_w, h.ecc_uncorrected_volatile) for h in power] == [
        (0, 25, 30.39, 600, 0), (1, 25, 28.54, 600, 0)]
    assert [(h.index, h.clocks_event_reasons, h.throttle_reasons) for h in throttle] == [
        (0, 0x4, ("sw_power_cap",)), (1, 0x4, ("sw_power_cap",))]


def test_probe_csv_reads_enabled_yes_hex_and_placeholders() -> None:
    hs = smi("smi-reconstructed-a100x4-probe-query.csv")
    assert [h.index for h in hs] == [0, 1, 2, 3]
    g1, g2, g3 = hs[1], hs[2], hs[3]
    assert (g1.pci_bus_id, g1.persistence_mode, g1.throttle_reasons) == (
        "0000:0f:00", True, ("sw_thermal_slowdown", "hw_thermal_slowdown"))
    assert (g2.ecc_uncorrected_volatile, g2.remapped_rows_pending, g2.remapped_rows_failure) == (1, True, False)
    assert (g3.power_w, g3.power_limit_w, g3.persistence_mode, g3.remapped_rows_pending) == (None, None, False, None)
    assert g3.unsupported == ("power.draw", "remapped_rows.pending", "remapped_rows.failure")


def test_older_probe_csv_without_remapped_rows_has_them_none_and_still_judges_the_rest() -> None:
    g0, g1 = smi("smi-reconstructed-r470-throttle-naming.csv")
    assert (g0.clocks_event_reasons, g0.retired_pages_pending, g0.remapped_rows_pending) == (0x8, True, None)
    assert [(f.id, f.gpu) for f in health_findings([g0, g1])] == [
        ("ecc-uncorrected", 1), ("retired-pages-pending", 0), ("hw-slowdown", 0), ("persistence-off", 0),
        ("persistence-off", 1)]


def test_headerless_csv_of_an_older_probe_gives_each_gpu_with_no_health_fields() -> None:
    text = "0, GPU-aaa, NVIDIA A100, 100, 81920, 0, 60.5\n1, GPU-bbb, NVIDIA A100, 100, 81920, 0, 61.0\n"
    hs = gpu_health(GpuReport("nvidia-smi", smi_csv=text))
    assert [(h.index, h.uuid, h.power_w) for h in hs] == [(0, "GPU-aaa", 60.5), (1, "GPU-bbb", 61.0)]
    assert all(h.persistence_mode is None and h.clocks_event_reasons is None for h in hs)


def test_several_sweeps_keep_the_last_reading_of_each_gpu() -> None:
    head = "index, clocks_event_reasons.active, persistence_mode\n"
    text = head + "0, 0x0000000000000040, Enabled\n1, 0x0, Enabled\n" + head + "0, 0x0, Enabled\n1, 0x0, Disabled\n"
    hs = gpu_health(GpuReport("nvidia-smi", smi_csv=text))
    assert [(h.index, h.clocks_event_reasons, h.persistence_mode) for h in hs] == [(0, 0, True), (1, 0, False)]


def nvml_gpu(index: int, pci: str, **over: object) -> dict[str, object]:
    """One GPU as the probe's NVML reader sends it (None where the driver said NOT_SUPPORTED)."""
    d: dict[str, object] = {
        "index": index, "uuid": f"GPU-{index:08x}-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3",
        "memory_used_mib": 70123.0, "memory_total_mib": 81559.0, "utilization_pct": 98.0, "power_w": 611.5,
        "pci_bus_id": pci, "temperature_c": 63, "power_limit_w": 700.0, "persistence_mode": True,
        "ecc_uncorrected_volatile": 0, "retired_pages_pending": None,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "recovery_action": "none", "clocks_event_reasons": 0, "unsupported": ["retired_pages_pending"],
    }
    d.update(over)
    return d


H100S = [
    nvml_gpu(0, "00000000:0F:00.0"),
    nvml_gpu(1, "00000000:18:00.0", clocks_event_reasons=0x60, temperature_c=91),
    nvml_gpu(2, "00000000:3B:00.0", remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": True,
                                                   "failure": False}),
    nvml_gpu(3, "00000000:B1:00.0", persistence_mode=False),
]
H100_REPORT = GpuReport("nvml", nvml=tuple(H100S))


def test_nvml_dicts_read_every_field_and_none_stays_none() -> None:
    hs = gpu_health(H100_REPORT)
    assert [h.pci_bus_id for h in hs] == ["0000:0f:00", "0000:18:00", "0000:3b:00", "0000:b1:00"]
    h2 = hs[2]
    assert (h2.remapped_rows_pending, h2.remapped_rows_uncorrectable, h2.retired_pages_pending) == (True, 1, None)
    assert (h2.recovery_action, h2.power_w, h2.power_limit_w, h2.unsupported) == (
        "none", 611.5, 700.0, ("retired_pages_pending",))
    assert hs[1].throttle_reasons == ("sw_thermal_slowdown", "hw_thermal_slowdown")


def test_nvml_values_of_the_wrong_type_are_none_not_guessed() -> None:
    bad = nvml_gpu(0, "garbage", temperature_c="hot", persistence_mode="yes", ecc_uncorrected_volatile=True,
                   remapped_rows=[1, 2], clocks_event_reasons=None, unsupported="all")
    (h,) = gpu_health(GpuReport("nvml", nvml=(bad,)))
    assert (h.pci_bus_id, h.temperature_c, h.persistence_mode, h.ecc_uncorrected_volatile) == (None, None, None, None)
    assert (h.remapped_rows_pending, h.clocks_event_reasons, h.throttle_reasons, h.unsupported) == (None, None, (), ())


def test_a_consumer_gpu_without_ecc_or_row_remapping_gives_no_finding() -> None:
    geforce = {"index": 0, "name": "NVIDIA GeForce RTX 4090", "pci_bus_id": "00000000:01:00.0", "temperature_c": 45,
               "power_limit_w": 450.0, "persistence_mode": True, "ecc_uncorrected_volatile": None,
               "retired_pages_pending": None, "remapped_rows": None, "recovery_action": None,
               "clocks_event_reasons": 0x1, "unsupported": ["ecc_uncorrected_volatile", "remapped_rows"]}
    assert health_findings(gpu_health(GpuReport("nvml", nvml=(geforce,)))) == []


def test_a_malformed_entry_costs_only_its_gpu_and_no_report_gives_nothing() -> None:
    report = GpuReport("nvml", nvml=("not a dict", nvml_gpu(1, "00000000:18:00.0")))  # type: ignore[arg-type]
    assert [h.index for h in gpu_health(report)] == [1]
    assert gpu_health(None) == gpu_health(GpuReport(None, error="no GPUs visible")) == []
    assert gpu_health(GpuReport("nvidia-smi", smi_csv="")) == []


@pytest.mark.parametrize("error, action", [("NVMLError_GpuIsLost: GPU is lost", GpuAction.REBOOT),
                                           ("NVMLError_ResetRequired: Reset required", GpuAction.RESET_GPU),
                                           ("NVMLError_Uninitialized: Uninitialized", None)])
def test_a_gpu_nvml_could_not_read_is_a_critical_finding(error: str, action: GpuAction | None) -> None:
    lost = {"index": 1, "uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0",
            "error": error, "unsupported": [], "field_errors": {}, "temperature_c": None, "remapped_rows": None,
            "persistence_mode": None, "clocks_event_reasons": None, "recovery_action": None}
    (h,) = gpu_health(GpuReport("nvml", nvml=(lost,)))
    assert (h.index, h.pci_bus_id, h.read_error, h.persistence_mode) == (1, "0000:18:00", error, None)
    (f,) = health_findings([h])
    assert (f.id, f.gpu, f.severity, f.action) == ("gpu-unreadable", 1, HealthSeverity.CRITICAL, action)


def test_throttle_bits_are_nvmls_own_values() -> None:
    pynvml = pytest.importorskip("pynvml")
    names = {"gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
             "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
             "sw_thermal_slowdown": "SwThermalSlowdown", "hw_thermal_slowdown": "HwThermalSlowdown",
             "hw_power_brake_slowdown": "HwPowerBrakeSlowdown", "display_clock_setting": "DisplayClockSetting"}
    assert {bit: getattr(pynvml, "nvmlClocksEventReason" + names[n]) for bit, n in THROTTLE_BITS.items()} == {
        bit: bit for bit in THROTTLE_BITS}


def test_decoding_names_bits_in_order_and_unknown_bits_by_value() -> None:
    assert decode_reasons(0x1FF) == tuple(THROTTLE_BITS.values())
    assert decode_reasons(0x400 | 0x4) == ("sw_power_cap", "0x400")
    assert decode_reasons(0) == decode_reasons(None) == ()


# -- findings --------------------------------------------------------------------------------------------------------

XID_79 = "[Mon Jun  3 10:21:11 2024] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def test_xid_79_lands_on_the_gpu_whose_pci_address_matches() -> None:
    hs = gpu_health(H100_REPORT)
    found = [f for f in health_findings(hs, xid_events([XID_79])) if f.id == "xid-79"]
    assert [(f.gpu, f.severity, f.action, f.evidence, f.count) for f in found] == [
        (1, HealthSeverity.CRITICAL, GpuAction.REBOOT, XID_79, 1)]


def test_an_xid_whose_address_matches_no_gpu_is_kept_with_gpu_none() -> None:
    line = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
    (f,) = [f for f in health_findings(gpu_health(H100_REPORT), xid_events([line])) if f.id.startswith("xid-")]
    assert (f.id, f.gpu, f.evidence) == ("xid-79", None, line)


def test_gpu_of_pci_may_use_nvidia_smis_spelling() -> None:
    (f,) = health_findings([], xid_events([XID_79]), gpu_of_pci={"00000000:18:00.0": 5})
    assert (f.id, f.gpu) == ("xid-79", 5)


def test_a_pending_row_remap_on_gpu_2_asks_for_a_gpu_reset() -> None:
    (f,) = [f for f in health_findings(gpu_health(H100_REPORT)) if f.id == "row-remap-pending"]
    assert (f.gpu, f.severity, f.action) == (2, HealthSeverity.WARNING, GpuAction.RESET_GPU)
    assert f.evidence == "remapped_rows.pending=yes, remapped_rows.uncorrectable=1"


def test_thermal_slowdown_bits_give_one_thermal_finding_with_the_temperature() -> None:
    (f,) = [f for f in health_findings(gpu_health(H100_REPORT)) if f.gpu == 1]
    assert (f.id, f.severity, f.action) == ("thermal-slowdown", HealthSeverity.WARNING, None)
    assert f.evidence == ("clocks_event_reasons.active=0x0000000000000060 (sw_thermal_slowdown, hw_thermal_slowdown), "
                          "temperature.gpu=91")


def test_persistence_off_is_an_info_finding_and_unknown_persistence_is_none() -> None:
    (f,) = [f for f in health_findings(gpu_health(H100_REPORT)) if f.gpu == 3]
    assert (f.id, f.severity, f.action, f.evidence) == ("persistence-off", HealthSeverity.INFO, None,
                                                        "persistence_mode=no")
    assert health_findings([GpuHealth(0, persistence_mode=None)]) == []


@pytest.mark.parametrize("mask", [0x1, 0x2, 0x10, 0x100, 0x1 | 0x2 | 0x10 | 0x100])
def test_idle_application_clocks_sync_boost_and_display_reasons_are_not_findings(mask: int) -> None:
    assert health_findings([GpuHealth(0, clocks_event_reasons=mask, throttle_reasons=decode_reasons(mask))]) == []


def test_hw_slowdown_is_a_finding_only_when_no_thermal_or_brake_cause_is_named() -> None:
    def ids(mask: int) -> list[str]:
        return [f.id for f in health_findings([GpuHealth(0, clocks_event_reasons=mask,
                                                         throttle_reasons=decode_reasons(mask))])]

    assert ids(0x8) == ["hw-slowdown"]
    assert ids(0x8 | 0x40) == ["thermal-slowdown"]
    assert ids(0x8 | 0x80) == ["power-slowdown"]


def test_the_power_cap_is_info_and_the_power_brake_a_warning() -> None:
    def severity(mask: int) -> HealthSeverity:
        (f,) = health_findings([GpuHealth(0, power_w=700.0, power_limit_w=700.0, clocks_event_reasons=mask,
                                          throttle_reasons=decode_reasons(mask))])
        assert f.id == "power-slowdown"
        return f.severity

    assert (severity(0x4), severity(0x80), severity(0x4 | 0x80)) == (
        HealthSeverity.INFO, HealthSeverity.WARNING, HealthSeverity.WARNING)


@pytest.mark.parametrize("word, action", [("reset", GpuAction.RESET_GPU), ("reboot", GpuAction.REBOOT),
                                          ("drain", GpuAction.DRAIN_NODE), ("bus_reset", GpuAction.RESET_GPU)])
def test_the_drivers_recovery_action_becomes_a_critical_finding_in_the_vocabulary(word: str,
                                                                                  action: GpuAction) -> None:
    (h,) = gpu_health(GpuReport("nvml", nvml=(nvml_gpu(0, "00000000:18:00.0", recovery_action=word),)))
    (f,) = health_findings([h])
    assert (f.id, f.severity, f.action) == ("recovery-action", HealthSeverity.CRITICAL, action)


def test_the_recovery_action_code_wins_over_its_word_where_the_probe_sent_both() -> None:
    drain_and_reset = nvml_gpu(0, "00000000:18:00.0", recovery_action="reset", recovery_action_code=4)
    imex = nvml_gpu(1, "00000000:3B:00.0", recovery_action=None, recovery_action_code=5)
    h0, h1 = gpu_health(GpuReport("nvml", nvml=(drain_and_reset, imex)))
    assert (h0.recovery_action, h1.recovery_action) == ("drain", "recover imex domain")
    assert [(f.gpu, f.action) for f in health_findings([h0, h1])] == [(0, GpuAction.DRAIN_NODE), (1, None)]


def test_ecc_and_failed_remaps_are_critical_and_a_failed_remap_drains() -> None:
    h = GpuHealth(4, ecc_uncorrected_volatile=3, remapped_rows_failure=True, retired_pages_pending=True)
    assert [(f.id, f.severity, f.action) for f in health_findings([h])] == [
        ("ecc-uncorrected", HealthSeverity.CRITICAL, GpuAction.RESET_GPU),
        ("row-remap-failed", HealthSeverity.CRITICAL, GpuAction.DRAIN_NODE),
        ("retired-pages-pending", HealthSeverity.WARNING, GpuAction.RESET_GPU)]


def test_repeated_xid_lines_collapse_into_one_finding_per_gpu_and_code_with_a_count() -> None:
    evs = xid_events((DATA / "xid-gpud-119.log").read_text()) + xid_events((DATA / "xid-gpud-pr46.txt").read_text())
    found = health_findings([GpuHealth(4, pci_bus_id="0000:9b:00")], evs)
    assert [(f.id, f.gpu, f.count) for f in found] == [("xid-119", 4, 5), ("xid-13", None, 3), ("xid-109", None, 1)]
    assert found[0].evidence.endswith("Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")  # the first line


def test_xid_154_takes_its_action_from_the_line() -> None:
    found = health_findings([GpuHealth(0, pci_bus_id="0000:01:00")],
                            xid_events((DATA / "xid-nvforum-364958.txt").read_text()))
    assert {f.id: f.action for f in found} == {"xid-120": GpuAction.RESET_GPU, "xid-154": GpuAction.RESET_GPU,
                                               "xid-62": GpuAction.RESET_GPU, "xid-45": GpuAction.RESTART_PROGRAM}
    line = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from "
    reboot = line + "0x0 (None) to 0x2 (Node Reboot Required)"
    cleared = line + "0x1 (GPU Reset Required) to 0x0 (None)"
    assert [f.action for f in health_findings([], xid_events([reboot]))] == [GpuAction.REBOOT]
    assert health_findings([], xid_events([cleared])) == []


def test_findings_come_most_severe_first_then_by_gpu() -> None:
    found = health_findings(smi("smi-reconstructed-a100x4-probe-query.csv"),
                            xid_events((DATA / "xid-reconstructed.txt").read_text()))
    assert [(f.id, f.gpu) for f in found] == [
        ("ecc-uncorrected", 2), ("xid-48", None), ("xid-64", None), ("xid-74", None), ("xid-79", None),
        ("xid-95", None), ("xid-119", None),
        ("thermal-slowdown", 1), ("row-remap-pending", 2), ("xid-13", None), ("xid-94", None),
        ("power-slowdown", 0), ("persistence-off", 3)]


def test_worst_action_is_the_one_that_takes_the_most_away() -> None:
    found = health_findings(gpu_health(H100_REPORT), xid_events([XID_79]))
    assert worst_action(found) == GpuAction.REBOOT
    assert worst_action(f for f in found if f.id != "xid-79") == GpuAction.RESET_GPU
    assert worst_action([]) is None
    assert list(GpuAction) == [GpuAction.RESTART_PROGRAM, GpuAction.RESET_GPU, GpuAction.DRAIN_NODE,
                               GpuAction.REBOOT]


def test_pci_index_maps_addresses_to_indices() -> None:
    assert pci_index(gpu_health(H100_REPORT)) == {"0000:0f:00": 0, "0000:18:00": 1, "0000:3b:00": 2,
                                                  "0000:b1:00": 3}


def test_health_and_finding_records_are_json_ready() -> None:
    hs = gpu_health(H100_REPORT)
    found = health_findings(hs, xid_events([XID_79]))
    doc = json.loads(json.dumps({"gpus": [h.to_record() for h in hs], "findings": [f.to_record() for f in found]}))
    assert doc["gpus"][1]["throttle_reasons"] == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert doc["findings"][0] == {"id": "xid-79", "gpu": 1, "severity": "critical", "meaning": XID_TABLE[79].meaning,
                                  "action": "reboot", "remedy": XID_TABLE[79].remedy, "evidence": XID_79, "count": 1}


def test_every_finding_id_and_table_xid_has_a_row_in_docs_failures_md() -> None:
    section = (ROOT / "docs" / "failures.md").read_text().partition("## GPU health findings")[2]
    assert section, "docs/failures.md lacks the GPU health findings section"
    for fid in [*FINDINGS, *(f"xid-{c}" for c in XID_TABLE), "xid-N"]:
        assert f"| `{fid}`" in section, fid
