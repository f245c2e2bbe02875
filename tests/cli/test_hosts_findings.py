"""The judging half of `hosts check`'s container findings (pure functions): the conf's device cgroup lines in order,
`devN:` passthrough, the older driver's /proc/devices name, version prefixes. The real-container side is
tests/cli/test_hosts_check_container.py."""

from __future__ import annotations

from dflashctl.commands.hosts import _allowed, _same_version, judge_devices, judge_driver
from dflashctl.model import Host

HOST = Host(name="pve", transport="ssh", address="pve.example.invalid", container=200)
GPU_HOST = Host(name="pve", transport="ssh", address="pve.example.invalid", container=200, gpus_target=(0,))
NODES = [{"path": "/dev/nvidia0", "major": 195, "minor": 0, "open_error": None},
         {"path": "/dev/nvidiactl", "major": 195, "minor": 255, "open_error": None},
         {"path": "/dev/nvidia-uvm", "major": 509, "minor": 0, "open_error": None}]


def side(lines, majors=None, kernel="550.54.14"):
    return {"conf": {"path": "/etc/pve/lxc/200.conf", "error": None, "lines": lines},
            "majors": {"nvidia-frontend": 195, "nvidia-uvm": 509} if majors is None else majors,
            "kernel_driver": {"version": kernel, "line": ""} if kernel else None}


def test_device_rules_apply_in_order_and_need_read_and_write() -> None:
    allow = ("lxc.cgroup2.devices.allow", "c 195:* rwm")
    assert _allowed([allow], 195, 0) and not _allowed([allow], 509, 0)
    assert not _allowed([allow, ("lxc.cgroup2.devices.deny", "c 195:0 rwm")], 195, 0)  # the later deny wins
    assert not _allowed([("lxc.cgroup2.devices.allow", "c 195:* r")], 195, 0)  # read-only: CUDA opens rw
    assert _allowed([("lxc.cgroup.devices.allow", "a")], 509, 0)  # cgroup v1's "allow everything"


def test_passed_through_devn_nodes_need_no_allow_line_and_the_old_nvidia_name_counts() -> None:
    lines = [["dev0", "/dev/nvidia0"], ["dev1", "/dev/nvidiactl"], ["dev2", "/dev/nvidia-uvm,mode=0666"]]
    assert judge_devices(HOST, NODES, side(lines)).status == "ok"
    old = side([["lxc.cgroup2.devices.allow", "c 195:* rwm"], ["lxc.cgroup2.devices.allow", "c 509:* rwm"]],
               majors={"nvidia": 195, "nvidia-uvm": 509})
    assert judge_devices(HOST, NODES, old).status == "ok"


def test_device_findings_fail_only_when_hosts_toml_uses_gpus_and_skip_without_a_driver() -> None:
    assert judge_devices(HOST, NODES, side([])).status == "warn"
    assert judge_devices(GPU_HOST, NODES, side([])).status == "fail"
    assert judge_devices(HOST, [], side([], majors={})).status == "skip"
    assert judge_devices(HOST, NODES, None).status == "skip"  # no container


def test_driver_versions_match_by_their_common_prefix() -> None:
    assert _same_version("550.54", "550.54.14") and not _same_version("550.54.14", "550.54.15")
    ok = judge_driver(HOST, {"smi": "550.54.14", "nvml": "550.54", "libs": ["550.54.14"]}, side([]))
    assert ok.status == "ok"
    bad = judge_driver(GPU_HOST, {"nvml": "550.54", "mismatch": True, "libs": []}, side([], kernel="550.90.07"))
    assert bad.status == "fail" and "install exactly 550.90.07 in the container" in bad.detail
    assert judge_driver(HOST, {"smi": "550.54.14"}, side([], kernel=None)).status == "skip"
