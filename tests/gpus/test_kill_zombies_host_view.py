"""kill-zombies through the host mapping of `gpus`: a zombie of an earlier run in this container is listed with its
GPU memory and ended; another container's processes and the host's are named (container, pid there, host pid) and
never signalled."""

from __future__ import annotations

import json

from dflashctl.cli import main

from .scene import OLD, THEIRS


def test_kill_zombies_ends_our_gpu_zombie_and_only_names_other_containers_and_the_host(scene, capsys):
    p, a, b = scene.procs, scene.pve.ctid, scene.other.ctid
    code = main(["kill-zombies", "--yes", "--json", "--grace", "5"])
    got = capsys.readouterr()
    doc = json.loads(got.out)
    assert code == 0, got.err
    rows = {r["pid"]: r for r in doc["zombies"]}
    zombie = rows[p["zombie"].ns_pid]
    assert (zombie["action"], zombie["run_id"], zombie["gpu_mib"]) == ("kill", OLD, 30000.0)
    assert zombie["outcome"] in ("terminated", "killed")
    assert rows[p["stray"].ns_pid]["action"] == "skip"  # unmarked in our container: listed, left
    notes = "\n".join(doc["notes"])
    assert f"container {a} " not in notes  # our own container's holders are the rows above
    assert f"container {b} pid {p['theirs'].ns_pid} (host pid {p['theirs'].host_pid}) holds 20000 MiB, run {THEIRS}" \
        f": not touched; not ours: ask the owner of container {b}" in notes
    assert f"host pid {p['host'].host_pid} on the Proxmox host holds 9000 MiB, no run of ours: not touched" in notes
    assert not scene.alive("zombie")
    for name in ("current", "stray", "theirs", "their-stray", "host"):
        assert scene.alive(name), f"{name} was signalled"
