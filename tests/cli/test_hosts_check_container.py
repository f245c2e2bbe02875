"""`hosts check` sees what LXC adds between a GPU and the trainer, on a real container (tests/harness/bin/pct):
the /dev/nvidia* nodes against the host's device majors and the device cgroup lines of /etc/pve/lxc/<CTID>.conf,
the container's user-space driver against the host's kernel module, and whether py-spy can attach (ptrace) in it.
The GPUs themselves are stand-ins: the nodes are mknod'ed with the numbers a test chooses, with no driver behind them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness.envs import NVIDIA_DRIVER, NVIDIA_MAJORS, PveEnv, nvidia_nodes
from harness.pyspy import py_spy_binary, without_py_spy

from dflashctl.cli import main


def check(capsys: pytest.CaptureFixture[str]) -> dict[str, dict]:
    main(["hosts", "check", "pve", "--json"])
    doc = json.loads(capsys.readouterr().out)
    return {c["name"]: c for c in doc["hosts"][0]["checks"]}


def open_error(pve: PveEnv, path: str) -> str:
    res = pve.exec(["python3", "-c", "import os,sys\ntry: os.close(os.open(sys.argv[1], os.O_RDWR))\n"
                    "except OSError as e: print(e.strerror)", path])
    return res.stdout.decode().strip()


@pytest.fixture
def lxc_only(pve: PveEnv) -> None:
    if pve.sshd.pct_backend != "lxc":
        pytest.skip("device cgroups, seccomp and the conf's lxc.* keys need real LXC (the namespace stand-in ran)")


def test_a_container_set_up_like_the_proxmox_gpu_guides_passes_devices_and_driver(pve: PveEnv, lxc_only,
                                                                                   capsys) -> None:
    pve.set_gpus([{}, {}])
    pve.pass_nvidia_through(gpus=2)
    checks = check(capsys)
    assert checks["devices"]["status"] == "ok", checks["devices"]
    assert checks["devices"]["detail"] == ("nvidia-uvm 509:0, nvidia0 195:0, nvidia1 195:1, nvidiactl 195:255: the "
                                           "host's majors, allowed by the device cgroup")
    assert checks["driver"]["status"] == "ok"
    assert checks["driver"]["detail"] == f"{NVIDIA_DRIVER} in CT {pve.ctid} = the host's kernel module {NVIDIA_DRIVER}"


def test_a_node_the_device_cgroup_does_not_allow_is_a_finding_with_the_conf_line_to_add(pve: PveEnv, lxc_only,
                                                                                       capsys) -> None:
    pve.set_gpus([{}])
    pve.set_host_nvidia(NVIDIA_MAJORS, NVIDIA_DRIVER)
    pve.mknod(nvidia_nodes(1, NVIDIA_MAJORS))  # the nodes exist, but the conf has no lxc.cgroup2.devices.allow
    assert open_error(pve, "/dev/nvidia0") == "Operation not permitted"  # what CUDA would meet: LXC's cgroup says no
    got = check(capsys)["devices"]
    assert got["status"] == "warn"  # no GPUs in hosts.toml: a warning; with GPUs configured a failure (below)
    assert got["detail"] == (f"/dev/nvidia-uvm (509:0) is not allowed by CT {pve.ctid}'s device cgroup: add "
                             f"`lxc.cgroup2.devices.allow: c 509:* rwm` to /etc/pve/lxc/{pve.ctid}.conf (or pass it "
                             "as `devN: /dev/nvidia-uvm`) and restart the container (+2 more)")  # nvidia0, nvidiactl

    pve.add_conf_lines("lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 509:* rwm")
    got = check(capsys)["devices"]  # the conf allows it now, the running container does not yet
    assert "fails with EPERM (Operation not permitted): the container runs with older device rules" in got["detail"]
    pve.restart_container()
    pve.mknod(nvidia_nodes(1, NVIDIA_MAJORS))
    assert check(capsys)["devices"]["status"] == "ok"


def test_a_stale_nvidia_uvm_major_is_named_against_the_hosts(pve: PveEnv, lxc_only, capsys, tmp_path) -> None:
    """nvidia-uvm's major is assigned when the module loads: a node made for 510 is wrong on a host that gave 509."""
    pve.set_gpus([{}])
    pve.pass_nvidia_through(gpus=1, majors={"nvidia-frontend": 195, "nvidia-uvm": 510})
    pve.set_host_nvidia(NVIDIA_MAJORS, NVIDIA_DRIVER)  # the host's driver reloaded: nvidia-uvm is 509 now
    got = check(capsys)["devices"]
    assert got["status"] == "warn"
    assert got["detail"].startswith(f"/dev/nvidia-uvm is 510:0 in CT {pve.ctid} but the host's nvidia-uvm major is "
                                    "509 (assigned when the module loads): recreate it from the host's node")
    gpus_toml = tmp_path / "gpu-hosts.toml"
    gpus_toml.write_text(pve.hosts_file.read_text().replace('python = "python3"\n',
                                                            'python = "python3"\ngpus = {target = [0]}\n', 1))
    assert main(["hosts", "check", "pve", "--json", "--hosts", str(gpus_toml)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert {c["name"]: c["status"] for c in doc["hosts"][0]["checks"]}["devices"] == "fail"


def test_a_user_space_driver_other_than_the_hosts_kernel_module_is_a_finding(pve: PveEnv, lxc_only, capsys) -> None:
    pve.set_gpus([{}])
    pve.gpus.extra(driver="550.54.14")  # the container's user space (its nvidia-smi, libnvidia-ml)
    pve.pass_nvidia_through(gpus=1, driver="550.90.07")  # the host's kernel module after a host update
    res = pve.exec(["nvidia-smi", "-L"])
    assert (res.returncode, res.stdout) == (18, b"Failed to initialize NVML: Driver/library version mismatch\n"
                                                b"NVML library version: 550.54\n")
    got = check(capsys)
    assert got["driver"]["status"] == "warn"
    assert got["driver"]["detail"].startswith(f"CT {pve.ctid}'s user-space driver is 550.54 but the host's kernel "
                                              "module is 550.90.07 (Driver/library version mismatch")
    assert "install exactly 550.90.07 in the container" in got["driver"]["detail"]
    pve.set_host_nvidia(NVIDIA_MAJORS, "550.54.14")
    assert check(capsys)["driver"]["status"] == "ok"


@pytest.fixture
def py_spy_in_ct(pve: PveEnv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary, why = py_spy_binary(tmp_path_factory.mktemp("pyspy"))
    if binary is None:
        pytest.skip(f"no py-spy to be had offline: {why}")
    pve.set_environment("PATH", f"{binary.parent}:{without_py_spy(pve.environment('PATH') or '')}")
    return binary


def test_py_spy_that_can_attach_in_the_container_passes(pve: PveEnv, lxc_only, py_spy_in_ct, capsys) -> None:
    got = check(capsys)["py-spy"]
    assert got["status"] == "ok" and got["detail"].endswith(f"({py_spy_in_ct}), attaches"), got


def test_py_spy_installed_but_denied_ptrace_by_the_containers_seccomp_is_a_warning(
    pve: PveEnv, lxc_only, py_spy_in_ct, capsys, tmp_path
) -> None:
    """Installed is not enough: a seccomp profile that denies ptrace/process_vm_readv (Docker's default without
    CAP_SYS_PTRACE does the same) makes `py-spy dump` fail with EPERM inside the container."""
    profile = tmp_path / "noptrace.seccomp"
    profile.write_text("2\ndenylist\n[all]\nkexec_load errno 1\nptrace errno 1\nprocess_vm_readv errno 1\n")
    pve.add_conf_lines(f"lxc.seccomp.profile: {profile}")
    pve.restart_container()
    got = check(capsys)["py-spy"]
    assert got["status"] == "warn", got
    assert "cannot attach to a process here (" in got["detail"] and "EPERM" in got["detail"]
    assert "ptrace is denied in this container" in got["detail"]
