"""analysis/hostgpus.py on real nvidia-smi outputs (sources in data/README.md) and the host probe's reply shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashctl.analysis.gpus import GpuParseError
from dflashctl.analysis.hostgpus import (
    Runs,
    build_view,
    container_of,
    parse_apps,
    role_of,
    share,
)

DATA = Path(__file__).parent / "data"


def test_compute_apps_of_a_containers_process_on_the_host_give_its_host_pid():
    apps = parse_apps((DATA / "apps-nvidia-docker-1483-host.csv").read_text())
    assert [(a.pid, a.process_name, a.used_memory_mib) for a in apps] == [
        (40170, "/opt/rh/rh-python38/root/usr/bin/python3", 185.0)]


def test_compute_apps_with_the_exporters_extra_columns_read_by_their_header():
    apps = parse_apps((DATA / "apps-590.48.01-h100-load.csv").read_text())
    assert [(a.pid, a.process_name, a.used_memory_mib) for a in apps] == [
        (11327, "/root/tools/memhog", 2566.0), (11328, "/root/tools/memhog", 1542.0), (11345, "./gpu_burn", 15690.0)]
    assert {a.gpu_uuid for a in apps} == {"GPU-00000000-0000-0000-0000-000000000000"}


def test_compute_apps_nounits_and_a_process_name_with_commas_and_not_found():
    text = ("pid, process_name, used_gpu_memory [MiB], gpu_uuid\n"
            "1758887, [Not Found], 58060, GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72\n"
            "17, python -c import a, b, 512, GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72\n")
    apps = parse_apps(text)
    assert (apps[0].pid, apps[0].process_name, apps[0].used_memory_mib) == (1758887, None, 58060.0)
    assert (apps[1].process_name, apps[1].used_memory_mib) == ("python -c import a, b", 512.0)


def test_compute_apps_header_only_is_no_process_and_headerless_rows_are_refused():
    assert parse_apps("pid, process_name, used_gpu_memory [MiB]\n") == []
    assert parse_apps("") == []
    with pytest.raises(GpuParseError):
        parse_apps("40170, python3, 185 MiB\n")


@pytest.mark.parametrize(("cgroup", "ct"), [
    ("0::/lxc/200/ns/user.slice/user-0.slice/session-1.scope\n", "200"),  # Proxmox VE 7+ (cgroup v2)
    ("0::/lxc.payload.201/init.scope\n", "201"),  # LXC 4+'s default naming
    ("12:pids:/lxc/105\n11:memory:/lxc/105\n0::/lxc/105\n", "105"),  # a v1 hierarchy
    ("0::/system.slice/ssh.service\n", None),  # the host's own
    ("0::/lxc.monitor.200\n", None),  # LXC's monitor process runs on the host, not in the container
    ("0::/\n", None),
])
def test_container_of_a_cgroup(cgroup, ct):
    assert container_of(cgroup) == ct


def test_run_roles_current_earlier_other_none():
    runs = Runs("r2", frozenset({"r1", "r2"}))
    assert role_of("r2", "200", "200", runs) == "current"
    assert role_of("r1", "200", "200", runs) == "earlier"
    assert role_of("rX", "200", "200", runs) == "other"  # another workspace's marker in our container
    assert role_of("r1", "201", "200", runs) == "other"  # another container's run: never ours to end
    assert role_of(None, "200", "200", runs) == "none"


def _reply(apps: str, procs: dict, mem=(80000, 512), util=(0, 0)) -> dict:
    rows = (f"{i}, GPU-{i}, NVIDIA H100 80GB HBM3, {m}, 81559, {u}, 70.00\n"
            for i, (m, u) in enumerate(zip(mem, util, strict=True)))
    header = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], power.draw [W]\n"
    csv = header + "".join(rows)
    return {"time": 1000.0, "gpus": {"source": "nvidia-smi", "smi_csv": csv}, "apps_csv": apps, "procs": procs,
            "holders": None}


def test_view_places_processes_and_splits_memory_ours_against_others():
    apps = "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n9001, python3, 70000, GPU-0\n9002, x, 10000, GPU-0\n"
    procs = {"9001": {"cgroup": "0::/lxc/200/ns\n", "nspid": [9001, 41], "uid": 100000, "user": None,
                      "cmdline": "python -m trainer", "run_id": "r2", "starttime": 5},
             "9002": {"cgroup": "0::/lxc/201/ns\n", "nspid": [9002, 7], "uid": 0, "user": "root", "cmdline": "x",
                      "run_id": None, "starttime": 6}}
    view = build_view([_reply(apps, procs, util=(95, 0))], host="pve", ours="200",
                      runs=Runs("r2", frozenset({"r2"})), seen_from="host")
    g0 = view.gpus[0]
    assert [(p.pid, p.container, p.ns_pid, p.role) for p in g0.procs] == [(9001, "200", 41, "current"),
                                                                         (9002, "201", 7, "none")]
    assert g0.procs[0].user == "uid 100000"  # an unprivileged container's root, as the host names it
    assert share(view, [0]) == {0: (70000.0, 10000.0)}
    assert view.to_record()["gpus"][0]["processes"][1]["remedy"] == "not ours: ask the owner of container 201"


def test_a_process_is_placed_on_its_gpu_by_uuid_with_or_without_the_gpu_prefix_as_a_ranks_layout_is():
    apps = "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n9001, python3, 70000, gpu-1\n9002, x, 10, 0\n"
    view = build_view([_reply(apps, {})], host="pve", ours="200", runs=Runs(None, frozenset()), seen_from="host")
    assert [[p.pid for p in g.procs] for g in view.gpus] == [[9002], [9001]]


def test_view_from_inside_a_container_says_what_it_cannot_see():
    reply = _reply("pid, process_name, used_gpu_memory [MiB], gpu_uuid\n", {
        "57": {"cgroup": "0::/\n", "nspid": [57], "uid": 0, "user": "root", "cmdline": "python train.py",
               "run_id": "old", "starttime": 1}})
    reply["holders"] = [57]
    view = build_view([reply], host="ct", ours=None, runs=Runs(None, frozenset({"old"})), seen_from="machine")
    assert view.seen_from == "container"
    assert [(p.pid, p.gpu, p.role) for p in view.unplaced] == [(57, None, "earlier")]
    assert any("cannot be seen" in n for n in view.notes)
    assert view.gpus[0].finding == "idle-allocated"  # 80000 MiB at 0 %
