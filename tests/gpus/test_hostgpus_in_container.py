"""The host probe where only the container is reachable: run inside a real container, the driver (the nvidia-smi
stand-in, as inside LXC) lists no compute process although the GPUs hold memory, so the probe looks for /dev/nvidia*
holders itself, and the view says what cannot be seen from there."""

from __future__ import annotations

from dflashctl.analysis.hostgpus import Runs, build_view
from dflashctl.remote import agentcall, connect
from dflashctl.remote.agentcall import parse_replies


def test_the_host_probe_inside_a_container_says_what_it_cannot_see(pve):
    pve.set_gpus([{"memory.used": 80000, "utilization.gpu": 0}], processes=[{"pid": 4242, "used_memory": 80000,
                                                                           "gpu": 0}])
    with connect(pve.host) as target:  # inside the container, where a plain host would run it
        res = agentcall.run(target, "hostgpus", timeout=120)
    assert res.exit_code == 0, res.stderr.decode()
    doc = parse_replies(res.stdout)[-1]
    assert doc["gpus"]["source"] == "nvidia-smi" and doc["apps_error"] is None
    assert doc["holders"] == []  # nothing in this container has /dev/nvidia* open
    view = build_view([doc], host="ct", ours=None, runs=Runs(), seen_from="machine")
    assert view.seen_from == "container" and [g.finding for g in view.gpus] == ["idle-allocated"]
    assert any("other containers' and the host's processes cannot be seen" in n for n in view.notes)
