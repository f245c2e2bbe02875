"""`launch --cluster … --exclude-unhealthy-gpus` (issue 28 part 3) across two simulated Proxmox hosts, each with its
own nvidia-smi stand-in and its own kernel log: every node's GPUs are judged before any node starts; a node that
keeps fewer healthy GPUs than its ranks (`--nproc-per-node`) refuses the whole launch in one line naming it (nothing
launched anywhere); otherwise each node leaves out its own unhealthy GPUs (CUDA_VISIBLE_DEVICES) and the others
start as they are."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TRAIN = ["--", "--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set", "train.seq_len=64",
         "--set", "train.log_interval=1", "--set", 'devices.drafters=["cpu","cpu"]', "--set", "train.steps=100000"]
REMAP = {"remapped_rows.pending": "Yes"}
# GPU 1's PCI address in the nvidia-smi stand-in (00000000:19:00.0), as the driver writes it in the host's kernel log
XID_79_GPU1 = "[ 1234.567890] NVRM: Xid (PCI:0000:19:00): 79, pid=4242, name=python3, GPU has fallen off the bus."


def test_a_node_with_too_few_healthy_gpus_for_its_ranks_refuses_the_whole_launch(two_hosts, cli):
    h = two_hosts
    h.pve1.set_gpus([{"memory.used": 3}, {"memory.used": 3}])
    h.pve2.set_gpus([{"memory.used": 3}, {"memory.used": 3, **REMAP}])
    res = cli("launch", "--cluster", "duo", "--nproc-per-node", "2", "--exclude-unhealthy-gpus", *TRAIN)
    assert res.code == 2, res.err
    lines = [ln for ln in res.err.splitlines() if ln.startswith("ERROR:")]
    assert len(lines) == 1 and "Traceback" not in res.err, res.err
    assert ("cluster duo: node 1 (pve2): 1 healthy GPU(s) remain (0), the run needs 2: left out GPU 1 "
            "(row-remap-pending: remapped_rows.pending=yes") in lines[0]
    assert "node 0" not in lines[0]  # pve1 has what its ranks need
    assert lines[0].endswith("(nothing launched on any host)")
    assert h.run_dirs(h.pve1) == [] and h.run_dirs(h.pve2) == []


def test_each_node_leaves_out_its_own_unhealthy_gpus(two_hosts, cli):
    h = two_hosts
    h.pve1.set_gpus([{"memory.used": 3}, {"memory.used": 3}, {"memory.used": 3}])
    h.pve1.set_kernel_log([XID_79_GPU1])  # pve1's GPU 1 fell off the bus; pve2's kernel log is clean
    h.pve2.set_gpus([{"memory.used": 3}, {"memory.used": 3}])
    res = cli("launch", "--cluster", "duo", "--exclude-unhealthy-gpus", "--json", *TRAIN)
    assert res.code == 0, res.err
    doc = res.json()
    run_id = doc["run_id"]
    try:
        node0, node1 = doc["nodes"]
        assert any(n.startswith("left out GPU 1 (xid-79") and n.endswith("CUDA_VISIBLE_DEVICES=0,2")
                   for n in node0["notes"]), node0["notes"]
        assert not any("left out" in n for n in node1["notes"]), node1["notes"]
        env1 = json.loads((h.runs_dir(h.pve1) / run_id / "launch.json").read_text())["env"]
        env2 = json.loads((h.runs_dir(h.pve2) / run_id / "launch.json").read_text())["env"]
        assert env1["CUDA_VISIBLE_DEVICES"] == "0,2" and env1["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "CUDA_VISIBLE_DEVICES" not in env2
    finally:
        cli("stop", run_id, "--grace", "10", "--host", "pve1,pve2")
