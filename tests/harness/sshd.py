"""A real OpenSSH sshd on 127.0.0.1 for end-to-end tests, with throwaway keys and its own config.

Why each piece:
- own host key + client key + authorized_keys + known_hosts in a temp dir: nothing of the
  machine's ssh setup is read or written;
- `SetEnv PATH=…` puts tests/harness/bin (the `pct` / `argv-dump` stand-ins), the directory where
  a test "installs" the `nvidia-smi` stand-in, and the venv's bin first on every session's PATH;
- sshd runs in a private mount namespace where root's ~/.bashrc is hidden behind an empty file,
  because Debian's bash sources ~/.bashrc for ssh commands and a developer's rc (pyenv, cargo)
  would rewrite PATH and slow every command down;
- `pct` is bin/pct over real LXC containers (lxc-start / lxc-attach, lxcpath of this session under
  /tmp/dflashctl-lxc/<pid>) wherever LXC runs; bin/pct-ns (PID + mount namespaces) only where it cannot
  (`why_lxc_cannot_run`); `pct_backend` says which, and the pytest header prints it;
- everything is torn down by PID (`stop()`), including the test containers still running.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HARNESS = Path(__file__).resolve().parent
BIN = HARNESS / "bin"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
LXC_ROOT = Path("/tmp/dflashctl-lxc")  # <owner pid>/<lxcpath>/ per test process: short (LXC's socket names)
INIT_LXC = "/usr/sbin/init.lxc"


def why_sshd_cannot_run() -> str | None:
    """The reason end-to-end ssh tests must skip here, or None when they can run."""
    if os.geteuid() != 0:
        return "needs root (sshd runs as root; the pct stand-in uses unshare/nsenter)"
    if not os.path.exists(SSHD):
        return "OpenSSH sshd is not installed (apt-get install openssh-server)"
    for tool in ("ssh-keygen", "unshare", "nsenter", "setsid"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


def why_lxc_cannot_run() -> str | None:
    """The reason real LXC containers cannot back `pct` here (the namespace stand-in is used), or None."""
    if os.geteuid() != 0:
        return "needs root (privileged LXC containers)"
    for tool in ("lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "lxc-wait", "lxc-destroy"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install lxc)"
    if not os.access(INIT_LXC, os.X_OK):
        return f"{INIT_LXC} is missing (apt-get install lxc)"
    return _lxc_probe()


def _lxc_probe() -> str | None:
    """Start a minimal container, run `true` in it, destroy it: None, or why LXC fails here."""
    owned = _owned_dir()
    lxcpath = owned / "probe"
    root = lxcpath / "probe" / "rootfs"
    try:
        for d in ("usr", "etc", "proc", "sys", "dev", "tmp"):
            (root / d).mkdir(parents=True, exist_ok=True)
        for d in ("bin", "lib", "lib64", "sbin"):
            if Path("/usr", d).exists() and not (root / d).is_symlink():
                (root / d).symlink_to(f"usr/{d}")
        (lxcpath / "probe" / "config").write_text(
            f"lxc.uts.name = probe\nlxc.rootfs.path = dir:{root}\nlxc.mount.entry = /usr usr none bind,ro 0 0\n"
            "lxc.mount.auto = proc:mixed sys:ro\nlxc.net.0.type = empty\nlxc.apparmor.profile = unconfined\n"
            f"lxc.init.cmd = {INIT_LXC} --name probe -- /usr/bin/sleep infinity\nlxc.tty.max = 0\nlxc.autodev = 1\n")
        args = ["-P", str(lxcpath), "-n", "probe"]
        for step in (["lxc-start", *args], ["lxc-wait", *args, "-s", "RUNNING", "-t", "30"],
                     ["lxc-attach", *args, "--clear-env", "--", "/usr/bin/true"]):
            res = subprocess.run(step, capture_output=True, text=True, timeout=60)
            if res.returncode != 0:
                why = res.stderr.strip() or f"exit {res.returncode}"
                return f"`{step[0]}` failed: {why[:300]}"
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return f"LXC probe failed: {e}"
    finally:
        destroy_container(lxcpath, "probe")
        shutil.rmtree(lxcpath, ignore_errors=True)


def _owned_dir() -> Path:
    """LXC_ROOT/<our pid>, with an `owner` file (pid and start time) that tells a later session whether we live."""
    owned = LXC_ROOT / str(os.getpid())
    owned.mkdir(parents=True, exist_ok=True)
    (owned / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
    return owned


def reap_leftover_containers(root: Path = LXC_ROOT) -> list[str]:
    """Stop and destroy the containers of earlier test sessions whose owner process is gone (a killed run),
    then remove their lxcpath. Returns what it removed ("<lxcpath>/<name>")."""
    removed = []
    for owned in sorted(root.glob("*")) if root.is_dir() else ():
        if not owned.name.isdigit():
            continue
        alive = _start_time(int(owned.name))
        try:
            owner_start = (owned / "owner").read_text().split()[1]
        except (OSError, IndexError):
            owner_start = alive  # being set up right now by a live session (or a dead one's pid, reused)
        if alive is not None and alive == owner_start:
            continue  # its session still runs
        for lxcpath in _subdirs(owned):
            for ct in sorted(p for p in _subdirs(lxcpath) if (p / "config").is_file()):
                destroy_container(lxcpath, ct.name)
                removed.append(f"{lxcpath}/{ct.name}")
        shutil.rmtree(owned, ignore_errors=True)
    for lxcpath, name in _lxc_monitors(root):  # a container whose lxcpath is gone already (killed mid-teardown)
        owner = Path(lxcpath).relative_to(root).parts[0]
        if owner.isdigit() and not (root / owner).exists():
            destroy_container(Path(lxcpath), name)
            removed.append(f"{lxcpath}/{name}")
    return removed


def _subdirs(path: Path) -> list[Path]:
    """path's directories, sorted; none once it is gone: a session that just ended removes its own lxcpath (stop())
    while another one's reap is looking at it (two pytest runs on one machine)."""
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []


def _lxc_monitors(root: Path) -> list[tuple[str, str]]:
    """(lxcpath, name) of every running container under root, from its monitor process (`[lxc monitor] PATH NAME`)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
        except OSError:
            continue
        if args[:2] == ["[lxc", "monitor]"] and len(args) == 4 and args[2].startswith(f"{root}/"):
            found.append((args[2], args[3]))
    return found


def destroy_container(lxcpath: Path, name: str) -> None:
    """lxc-stop --kill (if running) then lxc-destroy: nothing of the container is left."""
    args = ["-P", str(lxcpath), "-n", name]
    subprocess.run(["lxc-stop", *args, "--kill"], capture_output=True, timeout=60)
    subprocess.run(["lxc-wait", *args, "-s", "STOPPED", "-t", "30"], capture_output=True, timeout=60)
    subprocess.run(["lxc-destroy", *args], capture_output=True, timeout=60)
    shutil.rmtree(lxcpath / name, ignore_errors=True)
    (lxcpath / f"{name}.log").unlink(missing_ok=True)


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port() -> int:
    """A loopback port nobody listens on (for 'connection refused' tests)."""
    return free_port()


@dataclass
class SshdServer:
    """One running sshd. Attributes are what a test needs to reach it."""

    root: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    client_key: Path = field(init=False)
    host_key: Path = field(init=False)
    known_hosts: Path = field(init=False)
    ssh_config: Path = field(init=False)
    pct_state: Path = field(init=False)
    gpu_bin: Path = field(init=False)
    gpu_scenario: Path = field(init=False)
    log: Path = field(init=False)
    pct_backend: str = "lxc"  # "lxc": bin/pct over real LXC; "ns": bin/pct-ns (namespaces)
    lxcpath: Path | None = None

    address = "127.0.0.1"
    user = "root"

    def __post_init__(self) -> None:
        self.client_key = self.root / "client_ed25519"
        self.host_key = self.root / "host_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        self.pct_state = self.root / "pct"
        self.gpu_bin = self.root / "gpubin"
        self.gpu_scenario = self.root / "gpus.json"
        self.log = self.root / "sshd.log"
        self.pct_bin = self.root / "pctbin"
        self.host_root = self.root / "hostroot"  # $DFLASHCTL_HOST_ROOT: the Proxmox host's files hostcheck reads

    @property
    def session_path(self) -> str:
        venv_bin = str(Path(sys.executable).parent)
        return ":".join([str(self.pct_bin), str(BIN), str(self.gpu_bin), venv_bin, "/usr/local/sbin", "/usr/local/bin",
                         "/usr/sbin", "/usr/bin", "/sbin", "/bin"])

    @property
    def env(self) -> dict[str, str]:
        """Environment a local `pct`/`nvidia-smi` call needs to see what the ssh sessions see."""
        return {"PATH": self.session_path, "PCT_STATE": str(self.pct_state),
                "DFLASH_FAKE_GPUS": str(self.gpu_scenario), "DFLASHCTL_HOST_ROOT": str(self.host_root)}

    def start(self) -> SshdServer:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.pct_state / "lxc").mkdir(parents=True, exist_ok=True)
        (self.pct_state / "run").mkdir(parents=True, exist_ok=True)
        self.gpu_bin.mkdir(exist_ok=True)
        self._set_up_pct()
        self.set_host_nvidia(None, None)
        for key in (self.host_key, self.client_key):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dflashctl-test",
                                "-f", str(key)], check=True)
        authorized = self.root / "authorized_keys"
        authorized.write_text((self.client_key.with_suffix(".pub")).read_text())
        self.port = self.port or free_port()
        env = self.env
        setenv = " ".join(f"{k}={v}" for k, v in env.items())
        config = self.root / "sshd_config"
        config.write_text(
            f"Port {self.port}\n"
            f"ListenAddress {self.address}\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {authorized}\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PrintMotd no\n"
            "UseDNS no\n"
            "MaxSessions 100\n"
            "MaxStartups 100:30:200\n"
            "LogLevel VERBOSE\n"
            f"SetEnv {setenv}\n"
        )
        host_pub = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[{self.address}]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        self.ssh_config.write_text(
            f"# ssh_config for this test sshd (use: ssh -F {self.ssh_config} dflash-test)\n"
            "Host dflash-test\n"
            f"  HostName {self.address}\n  Port {self.port}\n  User {self.user}\n"
            f"  IdentityFile {self.client_key}\n  UserKnownHostsFile {self.known_hosts}\n"
            "  IdentitiesOnly yes\n"
        )
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation dir sshd insists on
        check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd rejected its test config: {check.stderr.strip()}")
        empty = self.root / "empty-rc"
        empty.write_text("")
        root_home = Path(pwd.getpwuid(0).pw_dir)  # sshd's session uses the passwd home, not $HOME
        hide = " ".join(
            f"mount --bind {empty} {rc};" for rc in (root_home / ".bashrc", Path("/etc/bash.bashrc")) if rc.exists()
        )
        script = f"{hide} exec {SSHD} -D -e -f {config}"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        self._wait_ready()
        return self

    def set_host_nvidia(self, majors: dict[str, int] | None, kernel_driver: str | None) -> None:
        """The Proxmox host's side of the NVIDIA driver, as agent/hostcheck.py reads it under $DFLASHCTL_HOST_ROOT:
        /etc/pve/lxc (the pct confs), /proc/devices (this machine's, plus `MAJOR name` lines for `majors`, e.g.
        {"nvidia-frontend": 195, "nvidia-uvm": 509}) and /proc/driver/nvidia/version (absent for None: no module)."""
        pve = self.host_root / "etc" / "pve"
        pve.mkdir(parents=True, exist_ok=True)
        if not (pve / "lxc").is_symlink():
            (pve / "lxc").symlink_to(self.pct_state / "lxc")
        proc = self.host_root / "proc"
        (proc / "driver" / "nvidia").mkdir(parents=True, exist_ok=True)
        lines = Path("/proc/devices").read_text().splitlines()
        extra = [f"{major:3d} {name}" for name, major in sorted((majors or {}).items(), key=lambda kv: kv[1])]
        cut = lines.index("") if "" in lines else len(lines)  # the end of "Character devices:"
        (proc / "devices").write_text("\n".join(lines[:cut] + extra + lines[cut:]) + "\n")
        version = proc / "driver" / "nvidia" / "version"
        if kernel_driver is None:
            version.unlink(missing_ok=True)
        else:  # the real file's two lines (an R550 capture's format)
            version.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {kernel_driver}  "
                               "Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")

    def _set_up_pct(self) -> None:
        """`pct` on the sessions' PATH: bin/pct (real LXC, this session's lxcpath) or bin/pct-ns."""
        self.pct_bin.mkdir(exist_ok=True)
        link = self.pct_bin / "pct"
        link.unlink(missing_ok=True)
        link.symlink_to(BIN / ("pct" if self.pct_backend == "lxc" else "pct-ns"))
        if self.pct_backend == "lxc":
            reap_leftover_containers()
            owned = _owned_dir()  # one lxcpath per server: a test may run two (tests/cluster)
            self.lxcpath = owned / f"s{next(i for i in itertools.count() if not (owned / f's{i}').exists())}"
            self.lxcpath.mkdir()
            (self.pct_state / "lxcpath").write_text(f"{self.lxcpath}\n")

    def _wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not answer on port {self.port}: {self.log.read_text()[-2000:]}")

    def ssh_argv(self, *remote: str) -> list[str]:
        """argv for the OpenSSH client against this server (for tests that compare with raw ssh)."""
        return ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", "dflash-test", *remote]

    def session_pids(self) -> list[int]:
        """PIDs of the per-connection sshd processes (children of the listener)."""
        if self.proc is None:
            return []
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def drop_connections(self) -> None:
        """Kill every live ssh connection (the listener stays): what a network drop looks like."""
        for pid in self.session_pids():
            _kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop every test container still running, then sshd. All by PID."""
        if self.lxcpath is not None and self.lxcpath.is_dir():
            for ct in sorted(self.lxcpath.iterdir()):
                if (ct / "config").is_file():
                    destroy_container(self.lxcpath, ct.name)
            shutil.rmtree(self.lxcpath, ignore_errors=True)
            owned = self.lxcpath.parent
            if {p.name for p in owned.iterdir()} <= {"owner"}:  # this process's last server: nothing left behind
                shutil.rmtree(owned, ignore_errors=True)
        run_dir = self.pct_state / "run"
        for pidfile in run_dir.glob("*.pid") if run_dir.exists() else ():
            init, upid, *cgroup = pidfile.read_text().split()
            for pid in (init, upid):
                _kill(int(pid), signal.SIGKILL)
            for _ in range(100):  # the cgroup can go once the namespace's processes are gone
                if not cgroup or _rmdir(Path(cgroup[0])):
                    break
                time.sleep(0.02)
            pidfile.unlink(missing_ok=True)
        for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
            _rmdir(root / "lxc")  # the harness's lxc/ cgroup parent, once no container uses it
        if self.proc is not None and self.proc.poll() is None:
            self.drop_connections()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
