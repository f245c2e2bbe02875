"""GPU health end to end through the loopback sshd + `pct` stand-in: an Xid 79 in the Proxmox host's kernel log on
GPU 6's PCI address and a pending row remap on GPU 2 (the nvidia-smi stand-in) → `status` names both GPUs, the
findings and what to do, in the table and in --json; `diagnose` reads the same from saved files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness.poll import wait_until

from dflashctl.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FAKE_TRAINER = Path(__file__).resolve().parents[1] / "lifecycle" / "fake_trainer" / "trainer"
# the real line's form (tests/analysis/data/gpuhealth/xid-*.txt), on the stand-in's GPU 6 (bus 0x18 + 6)
XID_79 = ("[Tue Dec  1 16:20:11 2026] NVRM: Xid (PCI:0000:1e:00): 79, pid=4242, name=python3, "
          "GPU has fallen off the bus.")
UNRELATED = "[Tue Dec  1 16:20:12 2026] usb 1-1: new high-speed USB device number 3 using xhci_hcd"


def eight_gpus() -> list[dict]:
    gpus = [{"memory.used": 60000, "utilization.gpu": 97, "power.draw": 520.0} for _ in range(8)]
    gpus[2].update({"remapped_rows.pending": "Yes", "remapped_rows.uncorrectable": 1})
    return gpus


def test_status_names_the_xid_79_gpu_and_the_pending_row_remap_with_their_actions(pve, capsys) -> None:  # noqa: ANN001
    pve.set_gpus(eight_gpus())
    pve.set_kernel_log([UNRELATED, XID_79])
    launched = main(["launch", "--source", str(FAKE_TRAINER), "--name", "health", "--wait-for", "step"])
    assert launched == 0, capsys.readouterr().err
    capsys.readouterr()
    main(["status", "--json"])
    doc = json.loads(capsys.readouterr().out)
    by_gpu = {(f["gpu"], f["id"]): f for f in doc["gpu_findings"]}
    xid = by_gpu[(6, "xid-79")]
    assert xid["severity"] == "critical" and xid["action"] == "reboot" and "fallen off the bus" in xid["evidence"]
    remap = by_gpu[(2, "row-remap-pending")]
    assert remap["action"] == "reset the GPU"
    assert {g for g, _ in by_gpu} == {2, 6}  # nothing invented for the other six, the USB line is no finding
    assert doc["gpu_action"] == "reboot"
    gpus = {g["index"]: g for g in doc["gpus"]}
    assert gpus[6]["health_findings"] == ["xid-79"] and "row-remap-pending" in gpus[2]["health_findings"]
    assert gpus[2]["health"]["remapped_rows_pending"] is True and gpus[0]["health"]["persistence_mode"] is True
    assert any(r.startswith("GPU 6: ") and "(xid-79)" in r for r in doc["reasons"])
    capsys.readouterr()
    main(["status"])
    table = capsys.readouterr().out
    assert "GPU health" in table and "GPU 6  xid-79" in table and "GPU 2  row-remap-pending" in table
    assert "what to do: reboot:" in table
    assert main(["stop"]) == 103


def test_diagnose_reads_the_same_findings_from_saved_files(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    kmsg = tmp_path / "dmesg.txt"
    kmsg.write_text(f"{UNRELATED}\n{XID_79}\n")
    smi = tmp_path / "smi.csv"
    smi.write_text("index, pci.bus_id, memory.used [MiB], utilization.gpu [%], remapped_rows.pending, "
                   "persistence_mode\n"
                   + "".join(f"{i}, 00000000:{0x18 + i:02X}:00.0, 60000, 97, {'Yes' if i == 2 else 'No'}, Enabled\n"
                             for i in range(8)))
    log = tmp_path / "train.log"
    log.write_text("step=1 loss=2.0\n")
    capsys.readouterr()
    main(["diagnose", str(log), "--gpus", str(smi), "--kernel-log", str(kmsg), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert {(f["gpu"], f["id"]) for f in doc["gpu_findings"]} == {(6, "xid-79"), (2, "row-remap-pending")}


FAST = ["--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set", "train.seq_len=64",
        "--set", "train.log_interval=1", "--set", "runtime.heartbeat_interval_s=0.2", "--set", "train.steps=100000"]


def test_spinning_gpus_and_no_new_step_are_the_spinning_stall_and_its_stacks_are_captured_once(
        pve, capsys, monkeypatch, tmp_path: Path) -> None:  # noqa: ANN001
    """Every drafter hangs at step 3 (the trainer's test fault) while the GPUs spin at ≈100 % at idle power: past the
    host's stall window the run is stalled with the spinning shape, and its sentinel saved what every thread was
    doing (the trainer's dump signal: py-spy is not in this container) — which status shows."""
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(pve.hosts_file.read_text().replace("[hosts.pve]\n", '[hosts.pve]\nstall_window = "4s"\n'))
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(hosts))
    pve.set_gpus([{"memory.used": 60000, "utilization.gpu": 99, "power.draw": 95.0} for _ in range(4)])
    hang = ",".join(f"drafter-{i}@3:hang" for i in range(3))
    assert main(["launch", "--name", "spin", "--env", f"DFLASH_FAULT={hang}", "--wait-for", "step", "--timeout",
                 "240", "--", *FAST]) == 0, capsys.readouterr().err
    def captured() -> dict | None:
        capsys.readouterr()
        main(["status", "--json"])
        doc = json.loads(capsys.readouterr().out)
        shaped = any(e["kind"] == "stalled" and e.get("stall_shape") == "spinning" for e in doc.get("events") or ())
        return doc if doc.get("stacks") and doc["stall_shape"] == "spinning" and shaped else None

    doc = wait_until(captured, timeout=180, what="the spinning stall's stack capture", every=1.0)
    assert doc["verdict"] == "stalled" and {g["finding"] for g in doc["gpus"]} == {"spinning"}
    assert "NCCL_DEBUG=INFO" in doc["stall_remedy"]
    threads = {t["thread"]: t for p in doc["stacks"]["processes"] for t in p["threads"]}
    assert {"drafter-0", "drafter-1", "drafter-2", "coordinator"} <= set(threads)
    assert threads["drafter-1"]["frames"][0]["function"] in ("check", "sleep")  # asleep in the fault's hang
    kinds = [e["kind"] for e in doc["events"]]
    assert kinds.count("stacks") == 1 and "stalled" in kinds
    stalled = [e for e in doc["events"] if e["kind"] == "stalled"]
    assert stalled[-1]["stall_shape"] == "spinning" and "NCCL_DEBUG=INFO" in stalled[-1]["stall_remedy"]
    capsys.readouterr()
    main(["status"])
    assert "stacks (captured" in capsys.readouterr().out
    assert main(["stop"]) == 103
