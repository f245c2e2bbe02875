"""Per-test environments on top of the sshd harness: a Proxmox-like host with one container
(`PveEnv`) and a plain local host (`LocalEnv`). See tests/harness/README.md for how to use them.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashctl.model import Host
from harness.sshd import BIN, HARNESS, SshdServer, destroy_container

# CTIDs: 200, 201, … offset per pytest process so that concurrent sessions on one machine (each
# with its own sshd and pct state) never share a cgroup lxc/<CTID>.
_ctids = itertools.count(200 + 1000 * (os.getpid() % 1000))
NVIDIA_SMI = HARNESS / "gpu" / "nvidia-smi"  # not on PATH itself: set_gpus() links it into a PATH dir
LXC_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # lxc-attach --clear-env's PATH
NVIDIA_MAJORS = {"nvidia-frontend": 195, "nvidia-uvm": 509}  # nvidia-uvm's is given at module load (509-511 seen)
NVIDIA_DRIVER = "580.173.02"  # the nvidia-smi stand-in's default (user-space) driver
ENV_MODES = ("keep-env", "clear-env")  # `pct exec`'s two environment modes (--keep-env 1 | 0)


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def nvidia_nodes(gpus: int, majors: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The /dev nodes of `gpus` GPUs: nvidiaN (frontend major, minor N), nvidiactl (minor 255), nvidia-uvm (0)."""
    front, uvm = majors["nvidia-frontend"], majors["nvidia-uvm"]
    return {**{f"/dev/nvidia{i}": (front, i) for i in range(gpus)}, "/dev/nvidiactl": (front, 255),
            "/dev/nvidia-uvm": (uvm, 0)}


class GpuScript:
    """Writes the scenario the nvidia-smi stand-in reads; installs / removes it from PATH."""

    def __init__(self, scenario: Path, bin_dir: Path):
        self.scenario = scenario
        self.bin_dir = bin_dir
        self.link = bin_dir / "nvidia-smi"
        self.set(None)

    def set(self, gpus: Sequence[dict[str, Any]] | None, processes: Sequence[dict[str, Any]] = ()) -> None:
        """gpus=None: nvidia-smi absent (command not found); []: present, "No devices were found"."""
        self.frames(None if gpus is None else [list(gpus)], processes)

    def frames(self, frames: Sequence[Sequence[dict[str, Any]]] | None,
               processes: Sequence[dict[str, Any]] = ()) -> None:
        """Samples over time: each nvidia-smi query consumes the next frame; the last one repeats."""
        Path(str(self.scenario) + ".count").unlink(missing_ok=True)
        if frames is None:
            self.link.unlink(missing_ok=True)
            self.scenario.unlink(missing_ok=True)
            return
        self._write({"frames": [list(f) for f in frames], "processes": list(processes)})

    def fail(self, message: str | None = None, code: int = 9) -> None:
        """nvidia-smi present but the driver is broken (the real tool's exit 9 text by default)."""
        doc: dict[str, Any] = {"fail": {"code": code}}
        if message is not None:
            doc["fail"]["message"] = message
        self._write(doc)

    def extra(self, **fields: Any) -> None:
        """Add options to the current scenario: sleep=SECONDS (hang like a wedged GPU), or
        rendezvous={"dir": ..., "count": N} (each call waits until N calls run at once)."""
        doc = json.loads(self.scenario.read_text()) if self.scenario.exists() else {"frames": []}
        doc.update(fields)
        self._write(doc)

    def _write(self, doc: dict[str, Any]) -> None:
        tmp = self.scenario.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.scenario)
        if not self.link.is_symlink():
            self.link.symlink_to(NVIDIA_SMI)


class _HostEnv:
    """What both test hosts offer: GPU scripting through their `gpus` and a Target for their `host`."""

    gpus: GpuScript
    host: Any

    def set_gpus(self, gpus: Sequence[dict[str, Any]] | None, processes: Sequence[dict[str, Any]] = ()) -> None:
        self.gpus.set(gpus, processes)

    def set_gpu_frames(self, frames: Sequence[Sequence[dict[str, Any]]] | None,
                       processes: Sequence[dict[str, Any]] = ()) -> None:
        self.gpus.frames(frames, processes)

    def connect(self):
        """A dflashctl Target for `host` (caller closes it, or use it as a context manager)."""
        from dflashctl.remote import connect

        return connect(self.host)


@dataclass
class PveEnv(_HostEnv):
    """A Proxmox-like host reached over the real test sshd, with one running container.

    `host` is a Host(transport="ssh", container=CTID); inside the container /workspace is
    `workspace_dir` on this machine. `hosts_file` has default = "pve" plus a `local` host.
    """

    sshd: SshdServer
    tmp: Path
    ctid: int = field(default_factory=lambda: next(_ctids))
    env_mode: str = "keep-env"  # `pct exec`'s default here: "keep-env" (PVE 8's) or "clear-env" (--keep-env 0)
    persist: bool = True  # False: hosts.toml says `persist = 0` (no connection master) for the tests of that path

    def __post_init__(self) -> None:
        self.workspace_dir = self.tmp / f"ct{self.ctid}-workspace"
        self.workspace_dir.mkdir(parents=True, exist_ok=True)
        self.local_workspace_dir = self.tmp / "local-workspace"
        self.conf = self.sshd.pct_state / "lxc" / f"{self.ctid}.conf"
        self.conf.write_text(self._proxmox_conf())
        self.set_env_mode(self.env_mode)
        self.gpus = GpuScript(self.sshd.gpu_scenario, self.sshd.gpu_bin)
        self.host = Host(
            name="pve", transport="ssh", address=self.sshd.address, port=self.sshd.port, user="root",
            identity_file=str(self.sshd.client_key), container=self.ctid, workspace="/workspace/dflash",
            python="python3", **({} if self.persist else {"persist_s": 0.0}),
        )
        self.hosts_file = self.tmp / "hosts.toml"
        self.hosts_file.write_text(
            'default = "pve"\n\n'
            "[hosts.pve]\n"
            'transport = "ssh"\n'
            f"address = {toml_str(self.sshd.address)}\n"
            f"port = {self.sshd.port}\n"
            'user = "root"\n'
            f"identity_file = {toml_str(str(self.sshd.client_key))}\n"
            f"container = {self.ctid}\n"
            'workspace = "/workspace/dflash"\n'
            'python = "python3"\n'
            + ("" if self.persist else "persist = 0\n")  # default: the connection master a user gets
            + "\n[hosts.local]\n"
            'transport = "local"\n'
            f"workspace = {toml_str(str(self.local_workspace_dir))}\n"
            f"python = {toml_str(sys.executable)}\n"
        )
        self.start_container()

    def set_env_mode(self, mode: str) -> None:
        """`pct exec`'s default from now on: "keep-env" (Proxmox VE 8's) or "clear-env" (--keep-env 0, announced as
        PVE 9's default). The harness's knob: $PCT_STATE/lxc/<CTID>.keep-env-default (bin/pct)."""
        if mode not in ENV_MODES:
            raise ValueError(f"env_mode must be one of {ENV_MODES}, not {mode!r}")
        self.env_mode = mode
        keep_default = self.sshd.pct_state / "lxc" / f"{self.ctid}.keep-env-default"
        if mode == "clear-env":
            keep_default.write_text("0\n")
        else:
            keep_default.unlink(missing_ok=True)

    def _proxmox_conf(self) -> str:
        """/etc/pve/lxc/<CTID>.conf of the test CT: /workspace as mount point mp0; read-only bind mounts of the
        interpreter, the venv and the repo (torch, dflashctl, the stand-ins), the test session's temp tree at its own
        path (scenario files, logs a test names); the CT's configured environment (`lxc.environment`: with
        --keep-env 0 all a command gets): the test image has the nvidia-smi stand-in and a python3 with torch (the
        venv) on its PATH."""
        image_path = ":".join([str(self.sshd.gpu_bin), str(Path(sys.executable).parent), LXC_DEFAULT_PATH])
        lines = ["arch: amd64", f"hostname: ct{self.ctid}", "ostype: debian",
                 f"mp0: {self.workspace_dir},mp=/workspace"]
        for src, mode in self._binds():
            lines.append(f"lxc.mount.entry: {src} {str(src).lstrip('/')} none bind,{mode},create=dir 0 0")
        lines += [f"lxc.environment: PATH={image_path}", f"lxc.environment: DFLASH_FAKE_GPUS={self.sshd.gpu_scenario}"]
        return "".join(f"{ln}\n" for ln in lines)

    def _binds(self) -> list[tuple[Path, str]]:
        repo = HARNESS.parent.parent
        binds = [(Path(sys.base_prefix).resolve(), "ro"), (repo, "ro")]
        venv = Path(sys.prefix)
        if repo not in venv.parents and venv != repo:
            binds.append((venv, "ro"))
        binds.append((self.sshd.root.parent, "rw"))  # the test session's temp tree (sshd root, tmp_path)
        return binds

    def set_environment(self, key: str, value: str) -> None:
        """Set the CT's `lxc.environment: KEY=VALUE` (the conf); the next `pct exec` sees it. With real LXC the running
        container's LXC config gets the same line (lxc-attach reads it on each attach), so no restart is needed."""
        lines = [ln for ln in self.conf.read_text().splitlines() if not ln.startswith(f"lxc.environment: {key}=")]
        self.conf.write_text("".join(f"{ln}\n" for ln in [*lines, f"lxc.environment: {key}={value}"]))
        if self.sshd.lxcpath is not None:
            live = self.sshd.lxcpath / str(self.ctid) / "config"
            kept = [ln for ln in live.read_text().splitlines() if not ln.startswith(f"lxc.environment = {key}=")]
            live.write_text("".join(f"{ln}\n" for ln in [*kept, f"lxc.environment = {key}={value}"]))

    def environment(self, key: str) -> str | None:
        """The CT's configured value of KEY (its `lxc.environment` line), or None."""
        for ln in self.conf.read_text().splitlines():
            if ln.startswith(f"lxc.environment: {key}="):
                return ln.split("=", 1)[1]
        return None

    @property
    def env(self) -> dict[str, str]:
        """Environment for dflashctl (in-process via monkeypatch, or a subprocess): the test
        known_hosts, no user ~/.ssh/config, and this hosts.toml."""
        return {
            "DFLASHCTL_KNOWN_HOSTS": str(self.sshd.known_hosts),
            "DFLASHCTL_SSH_CONFIG": os.devnull,
            "DFLASHCTL_HOSTS": str(self.hosts_file),
        }

    def pct(self, *args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run the pct stand-in directly on this machine (not through ssh): test-side control."""
        return subprocess.run(["pct", *args], input=stdin, capture_output=True, timeout=timeout,
                              env={**os.environ, **self.sshd.env})

    def exec(self, argv: Sequence[str], stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """`pct exec CTID -- argv` run locally: look inside the container without the code under test."""
        return self.pct("exec", str(self.ctid), "--", *argv, stdin=stdin, timeout=timeout)

    def start_container(self) -> None:
        res = self.pct("start", str(self.ctid))
        if res.returncode != 0:
            raise RuntimeError(f"pct start {self.ctid} failed: {res.stderr.decode()}")

    def stop_container(self) -> None:
        res = self.pct("stop", str(self.ctid))
        if res.returncode != 0:
            raise RuntimeError(f"pct stop {self.ctid} failed: {res.stderr.decode()}")

    @property
    def container_cgroup(self) -> str | None:
        """The container's cgroup as /proc/<pid>/cgroup shows it: Proxmox's layout "/lxc/<CTID>/ns" with real LXC;
        "/lxc/<CTID>" from the namespace stand-in, or None where it could not create a cgroup v2 directory (then
        host-side PID->CT mapping can't be tested)."""
        if self.sshd.pct_backend == "lxc":
            return f"/lxc/{self.ctid}/ns"
        pidfile = self.sshd.pct_state / "run" / f"{self.ctid}.pid"
        fields = pidfile.read_text().split() if pidfile.exists() else []
        return f"/lxc/{self.ctid}" if len(fields) > 2 else None

    @property
    def init_pid(self) -> int:
        """The host pid of the container's PID 1 (init.lxc with real LXC)."""
        if self.sshd.lxcpath is not None:
            res = subprocess.run(["lxc-info", "-P", str(self.sshd.lxcpath), "-n", str(self.ctid), "-pH"],
                                 capture_output=True, text=True, timeout=30)
            return int(res.stdout.strip())
        return int((self.sshd.pct_state / "run" / f"{self.ctid}.pid").read_text().split()[0])

    def container_running(self) -> bool:
        return self.pct("status", str(self.ctid)).stdout.decode().strip() == "status: running"


    def restart_container(self) -> None:
        """pct stop + pct start: what a change of the conf's mounts or device rules needs, as on Proxmox."""
        self.stop_container()
        self.start_container()

    def add_conf_lines(self, *lines: str) -> None:
        """Append Proxmox conf lines (`lxc.cgroup2.devices.allow: c 195:* rwm`, `lxc.seccomp.profile: …`); they
        take effect at the next start (restart_container)."""
        self.conf.write_text(self.conf.read_text() + "".join(f"{ln}\n" for ln in lines))

    def mknod(self, nodes: dict[str, tuple[int, int]]) -> None:
        """Character device nodes in the container's /dev (fake /dev/nvidia*: no driver behind them; a restart
        loses them, as LXC's autodev /dev is created at each start)."""
        script = "".join(f"mkdir -p $(dirname {path}) && mknod {path} c {ma} {mi} && "
                         for path, (ma, mi) in nodes.items())
        res = self.exec(["sh", "-c", script + "true"])
        if res.returncode != 0:
            raise RuntimeError(f"mknod in CT {self.ctid} failed: {res.stderr.decode()}")

    def set_host_nvidia(self, majors: dict[str, int] | None, kernel_driver: str | None) -> None:
        """The Proxmox host's NVIDIA driver as `hosts check` reads it there (SshdServer.set_host_nvidia); the
        nvidia-smi stand-in in the container then reports a Driver/library version mismatch when the scenario's
        user-space `driver` differs from `kernel_driver`."""
        self.sshd.set_host_nvidia(majors, kernel_driver)
        if self.gpus.scenario.exists():
            self.gpus.extra(kernel_driver=kernel_driver)

    def pass_nvidia_through(self, gpus: int = 1, driver: str = NVIDIA_DRIVER,
                            majors: dict[str, int] | None = None) -> None:
        """A container set up the way the Proxmox GPU guides do it: the host's driver loaded (its majors in
        /proc/devices, its kernel module `driver`), `lxc.cgroup2.devices.allow: c MAJOR:* rwm` for each major in the
        conf, the container restarted, then /dev/nvidia0…, nvidiactl and nvidia-uvm with the host's numbers."""
        majors = dict(NVIDIA_MAJORS if majors is None else majors)
        self.set_host_nvidia(majors, driver)
        self.add_conf_lines(*(f"lxc.cgroup2.devices.allow: c {m}:* rwm" for m in sorted(set(majors.values()))))
        self.restart_container()
        self.mknod(nvidia_nodes(gpus, majors))

    def set_kernel_log(self, lines: Sequence[str]) -> None:
        """The Proxmox host's kernel log as `dmesg` prints it there (tests/harness/bin/dmesg reads $PCT_STATE/kmsg)."""
        (self.sshd.pct_state / "kmsg").write_text("".join(f"{ln}\n" for ln in lines))

    def close(self) -> None:
        """Stop the container and destroy it (its rootfs and LXC config); the conf goes too. With real LXC
        destroy_container's `lxc-stop --kill` is the stop (what `pct stop` runs): no `pct status` / `pct stop` round
        of bash + lxc-info before it."""
        if self.sshd.lxcpath is not None:
            destroy_container(self.sshd.lxcpath, str(self.ctid))
        elif self.container_running():
            self.stop_container()
        self.conf.unlink(missing_ok=True)
        self.conf.with_suffix(".keep-env-default").unlink(missing_ok=True)
        (self.sshd.pct_state / "kmsg").unlink(missing_ok=True)
        self.sshd.set_host_nvidia(None, None)
        self.gpus.set(None)


@dataclass
class LocalEnv(_HostEnv):
    """The `local` transport (subprocess) with a temp workspace and the same GPU scripting."""

    tmp: Path

    def __post_init__(self) -> None:
        self.workspace_dir = self.tmp / "local-workspace"
        self.workspace_dir.mkdir(parents=True, exist_ok=True)
        self.gpu_bin = self.tmp / "gpubin"
        self.gpu_bin.mkdir(exist_ok=True)
        self.gpus = GpuScript(self.tmp / "gpus.json", self.gpu_bin)
        self.host = Host(name="local", transport="local", workspace=str(self.workspace_dir), python=sys.executable)
        self.hosts_file = self.tmp / "hosts.toml"
        self.hosts_file.write_text(
            'default = "local"\n\n[hosts.local]\ntransport = "local"\n'
            f"workspace = {toml_str(str(self.workspace_dir))}\npython = {toml_str(sys.executable)}\n"
        )

    @property
    def env(self) -> dict[str, str]:
        path = ":".join([str(BIN), str(self.gpu_bin), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return {"PATH": path, "DFLASH_FAKE_GPUS": str(self.gpus.scenario), "DFLASHCTL_HOSTS": str(self.hosts_file)}

