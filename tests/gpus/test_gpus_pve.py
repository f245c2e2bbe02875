"""`dflashctl gpus` end to end: real sshd, real containers (pct stand-in), real processes in two containers and on
the host, the nvidia-smi stand-in listing them by host pid as the driver does."""

from __future__ import annotations

import json

from dflashctl.cli import main

from .scene import CUR, OLD, THEIRS


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def test_gpus_json_names_each_process_container_pid_inside_and_run(scene, capsys):
    code, out, err = _run(capsys, "gpus", "--json")
    doc = json.loads(out)
    assert doc["schema"] == 1 and doc["seen_from"] == "host" and doc["current_run"] == CUR, err
    by_pid = {p["pid"]: p for g in doc["gpus"] for p in g["processes"]}
    p, a, b = scene.procs, str(scene.pve.ctid), str(scene.other.ctid)
    expect = {  # name: (container, pid inside, run role, run id)
        "current": (a, p["current"].ns_pid, "current", CUR),
        "zombie": (a, p["zombie"].ns_pid, "earlier", OLD),
        "stray": (a, p["stray"].ns_pid, "none", None),
        "theirs": (b, p["theirs"].ns_pid, "other", THEIRS),
        "their-stray": (b, p["their-stray"].ns_pid, "none", None),
        "host": (None, p["host"].host_pid, "none", None),
    }
    for name, (ct, ns_pid, role, run_id) in expect.items():
        row = by_pid[p[name].host_pid]
        assert (row["container"], row["ns_pid"], row["run"], row["run_id"]) == (ct, ns_pid, role, run_id), name
    assert by_pid[p["zombie"].host_pid]["zombie"] is True
    assert {by_pid[p[n].host_pid]["user"] for n in expect} == {"root"}  # named from each one's own /etc/passwd
    assert "kill-zombies" in by_pid[p["zombie"].host_pid]["remedy"]
    assert f"container {b}" in by_pid[p["theirs"].host_pid]["remedy"]
    assert "sleep 3604" in by_pid[p["theirs"].host_pid]["cmdline"]
    gpus = {g["index"]: g for g in doc["gpus"]}
    assert gpus[1]["finding"] == "orphaned" and "kill-zombies" in gpus[1]["remedy"]
    assert gpus[3]["finding"] == "idle-allocated" and "the Proxmox host (ask its admin)" in gpus[3]["remedy"]
    assert gpus[0]["finding"] == "busy" and gpus[0]["ours_mib"] == 70000 and gpus[0]["others_mib"] == 1000
    assert code == 104  # GPUs held at 0 %


def test_gpus_table_shows_every_gpu_its_holders_and_what_to_do(scene, capsys):
    code, out, _ = _run(capsys, "gpus")
    p, b = scene.procs, scene.other.ctid
    assert f"ct {scene.pve.ctid} pid {p['zombie'].ns_pid}" in out and f"earlier {OLD} (zombie)" in out
    assert f"ct {b} pid {p['theirs'].ns_pid}" in out and f"other {THEIRS}" in out
    assert f"current {CUR}" in out
    assert "GPU 1: memory held by a zombie of an earlier run: `dflashctl kill-zombies`" in out
    assert f"not ours: ask the owner of container {b}" in out
    assert code == 104
