"""`nvidia-smi -q` text → GpuHealth on recorded outputs of four driver generations (R470, R510, R535, R590/R595) and
two reconstructed ones with the errors no published sample has (data/gpuhealth/README.md says where each comes from);
then the same records through gpuhealth.gpu_health and `dflashctl diagnose --gpus`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashctl.analysis.gpuhealth import gpu_health, health_findings
from dflashctl.analysis.gpus import GpuParseError, parse_nvidia_smi
from dflashctl.analysis.smiq import Q_REASON_BITS, THROTTLE_BITS, gpu_health_from_q, looks_like_q
from dflashctl.cli import main
from dflashctl.commands.diagnose import diagnose
from dflashctl.model import GpuAction, GpuHealth, GpuReport, HealthSeverity

DATA = Path(__file__).parent / "data" / "gpuhealth"
Q_FILES = sorted(p.name for p in DATA.glob("q-*.txt"))


def q(name: str) -> list[GpuHealth]:
    return gpu_health_from_q((DATA / name).read_text())


def only(name: str) -> GpuHealth:
    [h] = q(name)
    return h


def findings(name: str) -> list[tuple[str, int | None, HealthSeverity, GpuAction | None]]:
    return [(f.id, f.gpu, f.severity, f.action) for f in health_findings(q(name))]


# -- what is -q text -------------------------------------------------------------------------------------------------

def test_every_saved_q_output_looks_like_q_and_no_csv_or_table_does() -> None:
    assert len(Q_FILES) >= 8
    assert all(looks_like_q((DATA / n).read_text()) for n in Q_FILES)
    others = [p for p in (*DATA.glob("*.csv"), DATA.parent / "seed_nvidia_smi.csv", DATA / "xid-gpud-pr46.txt")]
    assert others and not any(looks_like_q(p.read_text()) for p in others)
    table = "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                    0 |\n"
    assert not looks_like_q(table) and not looks_like_q("")


def test_an_excerpt_without_the_nvsmi_banner_still_looks_like_q() -> None:
    text = (DATA / "q-510.73.08-a100-remap-pending.txt").read_text()
    assert "NVSMI LOG" not in text and looks_like_q(text)


@pytest.mark.parametrize("name", Q_FILES)
def test_the_sample_reader_rejects_q_text_so_diagnose_reads_health_only(name: str) -> None:
    with pytest.raises(GpuParseError):
        parse_nvidia_smi((DATA / name).read_text())


# -- per driver generation -------------------------------------------------------------------------------------------

def test_r470_v100_reads_throttle_reasons_power_readings_double_bit_total_and_retired_pages() -> None:
    h = only("q-470.129.06-v100-pcie.txt")
    assert h == GpuHealth(
        index=0, pci_bus_id="0000:1c:00", uuid="GPU-06e3d8e6-3f54-374a-8142-9752ca1f2316",
        name="Tesla V100-PCIE-32GB", temperature_c=29.0, power_w=25.13, power_limit_w=250.0, persistence_mode=True,
        ecc_uncorrected_volatile=0, retired_pages_pending=False, clocks_event_reasons=0x1,
        throttle_reasons=("gpu_idle",))
    # `Remapped Rows : N/A` (no remapper before Ampere) and no recovery field at all on R470: None, not "no"/"none"
    assert (h.remapped_rows_pending, h.remapped_rows_failure, h.remapped_rows_correctable, h.recovery_action) == (
        None, None, None, None)


def test_the_one_gpu_of_a_q_dash_i_file_is_index_0_by_position_not_its_minor_number() -> None:
    text = (DATA / "q-470.129.06-v100-pcie.txt").read_text()
    assert "Minor Number                          : 1" in text  # `nvidia-smi -q -i 1` of an 8-GPU node
    assert only("q-470.129.06-v100-pcie.txt").index == 0


def test_r510_a100_excerpt_gives_its_pending_row_remap_and_leaves_what_it_cut_out_none() -> None:
    h = only("q-510.73.08-a100-remap-pending.txt")
    assert (h.pci_bus_id, h.name, h.ecc_uncorrected_volatile) == ("0000:10:1c", "NVIDIA A100-SXM4-80GB", 0)
    assert (h.remapped_rows_correctable, h.remapped_rows_uncorrectable, h.remapped_rows_pending,
            h.remapped_rows_failure) == (1, 0, True, False)
    assert h.retired_pages_pending is None  # `Pending Page Blacklist : N/A` on Ampere
    assert (h.uuid, h.temperature_c, h.power_w, h.persistence_mode, h.clocks_event_reasons) == (None,) * 5  # `[...]`
    assert findings("q-510.73.08-a100-remap-pending.txt") == [
        ("row-remap-pending", 0, HealthSeverity.WARNING, GpuAction.RESET_GPU)]


def test_r535_a10_pending_remap_of_uncorrectable_rows_and_reset_status_read_as_no_recovery_needed() -> None:
    h = only("q-535.129.03-a10-remap-pending.txt")
    assert (h.remapped_rows_uncorrectable, h.remapped_rows_pending, h.remapped_rows_failure) == (4, True, False)
    assert h.recovery_action == "none"  # GPU Reset Status: Reset Required No, Drain and Reset Recommended N/A
    assert (h.clocks_event_reasons, h.power_w, h.power_limit_w, h.temperature_c) == (0x1, 43.89, 150.0, 33.0)
    [f] = health_findings([h])
    assert (f.id, f.action, f.evidence) == (
        "row-remap-pending", GpuAction.RESET_GPU, "remapped_rows.pending=yes, remapped_rows.uncorrectable=4")


def test_r535_h100_node_gives_eight_gpus_in_order_all_with_the_power_brake_engaged() -> None:
    hs = q("q-535.161.08-h100x8-power-brake.txt")
    assert [h.index for h in hs] == list(range(8))
    assert [h.pci_bus_id for h in hs] == ["0000:19:00", "0000:3b:00", "0000:4c:00", "0000:5d:00", "0000:9b:00",
                                          "0000:bb:00", "0000:cb:00", "0000:db:00"]
    assert {(h.clocks_event_reasons, h.throttle_reasons) for h in hs} == {
        (0x88, ("hw_slowdown", "hw_power_brake_slowdown"))}
    assert {(h.ecc_uncorrected_volatile, h.remapped_rows_pending, h.recovery_action) for h in hs} == {
        (0, False, "none")}
    assert hs[0].power_w == 67.74  # `GPU Power Readings`, not the `Module Power Readings : N/A` below it
    assert findings("q-535.161.08-h100x8-power-brake.txt") == [
        ("power-slowdown", i, HealthSeverity.WARNING, None) for i in range(8)]  # a brake, so not hw-slowdown


def test_r590_h100_q_and_its_query_gpu_csv_of_the_same_capture_give_the_same_record() -> None:
    h = only("q-590.48.01-h100-idle.txt")
    csv = gpu_health(GpuReport("nvidia-smi", smi_csv=(DATA / "probe-smi-590.48.01-h100-idle.csv").read_text()))
    assert [h] == csv
    assert (h.recovery_action, h.power_w, h.ecc_uncorrected_volatile) == ("none", 69.85, 0)  # Average Power Draw
    assert h.retired_pages_pending is None and h.remapped_rows_failure is False


def test_r595_geforce_without_ecc_or_remapper_reads_none_not_zero_and_persistence_off() -> None:
    h = only("q-595.71.05-rtx2080super-idle.txt")
    assert (h.ecc_uncorrected_volatile, h.retired_pages_pending, h.remapped_rows_pending,
            h.remapped_rows_uncorrectable) == (None,) * 4
    assert (h.persistence_mode, h.power_w, h.power_limit_w, h.recovery_action) == (False, 37.62, 250.0, "none")
    assert findings("q-595.71.05-rtx2080super-idle.txt") == [("persistence-off", 0, HealthSeverity.INFO, None)]


FIELDS = ("temperature_c", "power_w", "power_limit_w", "persistence_mode", "ecc_uncorrected_volatile",
          "retired_pages_pending", "remapped_rows_pending", "recovery_action", "clocks_event_reasons")


@pytest.mark.parametrize(("name", "absent"), [
    ("q-470.129.06-v100-pcie.txt", {"remapped_rows_pending", "recovery_action"}),
    ("q-535.129.03-a10-remap-pending.txt", {"retired_pages_pending"}),
    ("q-590.48.01-h100-idle.txt", {"retired_pages_pending"}),
    ("q-595.71.05-rtx2080super-idle.txt", {"ecc_uncorrected_volatile", "retired_pages_pending",
                                           "remapped_rows_pending"}),
])
def test_which_readings_each_driver_generation_has(name: str, absent: set[str]) -> None:
    h = only(name)
    assert {f for f in FIELDS if getattr(h, f) is None} == absent


# -- errors (reconstructed: no published -q shows them) ----------------------------------------------------------------

def test_reconstructed_r470_double_bit_errors_pending_retirement_and_thermal_slowdown_on_the_second_gpu() -> None:
    healthy, bad = q("q-reconstructed-470-v100x2-dbe-thermal.txt")
    assert healthy == only("q-470.129.06-v100-pcie.txt")
    assert (bad.index, bad.pci_bus_id, bad.ecc_uncorrected_volatile, bad.retired_pages_pending) == (
        1, "0000:1d:00", 2, True)
    assert bad.clocks_event_reasons == 0x8 | 0x20 | 0x40
    assert bad.throttle_reasons == ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown")
    assert findings("q-reconstructed-470-v100x2-dbe-thermal.txt") == [
        ("ecc-uncorrected", 1, HealthSeverity.CRITICAL, GpuAction.RESET_GPU),
        ("retired-pages-pending", 1, HealthSeverity.WARNING, GpuAction.RESET_GPU),
        ("thermal-slowdown", 1, HealthSeverity.WARNING, None)]


def test_reconstructed_r590_sums_sram_and_dram_uncorrectable_and_reads_failed_remap_and_recovery_reset() -> None:
    h = only("q-reconstructed-590-h100-ecc-remap-failed.txt")
    assert h.ecc_uncorrected_volatile == 1 + 2  # SRAM Uncorrectable SEC-DED 1 (+ Parity 0) + DRAM Uncorrectable 2
    assert (h.remapped_rows_uncorrectable, h.remapped_rows_failure, h.remapped_rows_pending) == (2, True, False)
    assert (h.recovery_action, h.clocks_event_reasons, h.power_w) == ("reset", 0x4, 698.40)
    assert findings("q-reconstructed-590-h100-ecc-remap-failed.txt") == [
        ("ecc-uncorrected", 0, HealthSeverity.CRITICAL, GpuAction.RESET_GPU),
        ("row-remap-failed", 0, HealthSeverity.CRITICAL, GpuAction.DRAIN_NODE),
        ("recovery-action", 0, HealthSeverity.CRITICAL, GpuAction.RESET_GPU),
        ("power-slowdown", 0, HealthSeverity.INFO, None)]


# -- N/A and throttle reasons ----------------------------------------------------------------------------------------

def _gpu(*lines: str) -> str:
    return "GPU 00000000:18:00.0\n    Product Name                          : NVIDIA A100\n" + "".join(
        f"    {line}\n" for line in lines)


@pytest.mark.parametrize("na", ["N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown", "Unknown Error", ""])
def test_every_not_available_spelling_is_none_never_zero_or_no(na: str) -> None:
    [h] = gpu_health_from_q(_gpu(
        f"Persistence Mode                      : {na}", "Temperature", f"    GPU Current Temp                  : {na}",
        "GPU Power Readings", f"    Power Draw                        : {na}",
        f"    Current Power Limit               : {na}", "ECC Errors", "    Volatile",
        f"        SRAM Uncorrectable            : {na}", f"        DRAM Uncorrectable            : {na}",
        "Remapped Rows", f"    Pending                           : {na}",
        f"    Uncorrectable Error               : {na}", f"GPU Recovery Action                   : {na}",
        "Clocks Event Reasons", f"    SW Power Cap                      : {na}"))
    assert h == GpuHealth(index=0, pci_bus_id="0000:18:00", name="NVIDIA A100", unsupported=h.unsupported)
    named = ("temperature.gpu", "power.draw", "enforced.power.limit", "persistence_mode",
             "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending", "remapped_rows.uncorrectable",
             "gpu_recovery_action")
    assert h.unsupported == (named if "Not Supported" in na else ())


def test_ecc_counts_present_are_summed_and_a_missing_one_does_not_hide_the_others() -> None:
    [h] = gpu_health_from_q(_gpu("ECC Errors", "    Volatile", "        SRAM Uncorrectable            : N/A",
                                 "        DRAM Uncorrectable            : 5", "    Aggregate",
                                 "        DRAM Uncorrectable            : 40"))
    assert h.ecc_uncorrected_volatile == 5


def test_throttle_reasons_read_only_active_and_not_active_and_all_unknown_is_none() -> None:
    def mask(*reasons: str) -> int | None:
        [h] = gpu_health_from_q(_gpu("Clocks Throttle Reasons", *(f"    {r}" for r in reasons)))
        return h.clocks_event_reasons

    assert mask("Idle : Not Active", "HW Slowdown : Active", "    HW Thermal Slowdown : N/A",
                "    HW Power Brake Slowdown : Active") == 0x88
    assert mask("Idle : Not Active", "SW Power Cap : Not Active") == 0  # read, nothing active
    assert mask("Idle : N/A", "Unknown Future Reason : Active") is None
    [h] = gpu_health_from_q(_gpu("Clocks Throttle Reasons                : N/A"))
    assert (h.clocks_event_reasons, h.throttle_reasons) == (None, ())


def test_each_q_label_maps_to_the_bit_nvml_gives_the_csv_field_of_that_name() -> None:
    assert {THROTTLE_BITS[bit]: label for label, bit in Q_REASON_BITS.items()} == {
        ("gpu_idle" if label == "idle" else label.replace(" ", "_")): label for label in Q_REASON_BITS}
    assert sorted(Q_REASON_BITS.values()) == sorted(THROTTLE_BITS)


def test_windows_line_ends_and_tabs_read_the_same() -> None:
    text = (DATA / "q-535.129.03-a10-remap-pending.txt").read_text()
    assert gpu_health_from_q(text.replace("\n", "\r\n")) == gpu_health_from_q(text.replace("    ", "\t"))
    assert gpu_health_from_q(text.replace("\n", "\r\n")) == q("q-535.129.03-a10-remap-pending.txt")


def test_text_after_the_last_gpu_section_and_before_the_first_is_not_read_into_it() -> None:
    text = (DATA / "q-590.48.01-h100-idle.txt").read_text()
    noisy = "vGPU Driver Capability\n        Heterogenous Multi-vGPU : Supported\n" + text + (
        "#### next command\n    Pending                           : Yes\n")
    assert gpu_health_from_q(noisy) == q("q-590.48.01-h100-idle.txt")
    assert gpu_health_from_q("No devices were found\n") == []


# -- through gpu_health and diagnose ---------------------------------------------------------------------------------

def test_gpu_health_reads_a_report_of_source_nvidia_smi_q() -> None:
    text = (DATA / "q-535.161.08-h100x8-power-brake.txt").read_text()
    assert gpu_health(GpuReport("nvidia-smi-q", smi_csv=text)) == gpu_health_from_q(text)
    assert gpu_health(GpuReport("nvidia-smi-q", smi_csv=None)) == []


def test_diagnose_gpus_q_file_gives_health_findings_and_no_samples() -> None:
    path = DATA / "q-535.129.03-a10-remap-pending.txt"
    d = diagnose([], [path])
    assert d.sources == [str(path)]
    assert d.health.gpus == []  # no memory/utilisation samples from -q
    assert d.health.gpu_health == q(path.name)
    assert [(f.id, f.gpu) for f in d.health.gpu_findings] == [("row-remap-pending", 0)]
    assert d.health.gpu_action == GpuAction.RESET_GPU


def test_diagnose_takes_samples_from_a_csv_and_health_from_a_later_q_file(capsys: pytest.CaptureFixture[str]) -> None:
    csv = DATA / "probe-smi-590.48.01-h100-idle.csv"
    code = main(["diagnose", "--gpus", str(csv), "--gpus", str(DATA / "q-reconstructed-590-h100-ecc-remap-failed.txt"),
                 "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert [g["index"] for g in doc["gpus"]] == [0]  # the CSV's sample
    assert [f["id"] for f in doc["gpu_findings"]] == ["ecc-uncorrected", "row-remap-failed", "recovery-action",
                                                      "power-slowdown"]
    assert doc["gpu_action"] == "drain the node"
    assert code == diagnose([], [csv, DATA / "q-reconstructed-590-h100-ecc-remap-failed.txt"]).health.exit_code
