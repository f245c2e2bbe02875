"""Two simulated Proxmox hosts on loopback: two real sshd (each its own port and `pct` stand-in state), one container
on each, and one hosts.toml naming both and a cluster of them. The stand-in containers share this machine's network
namespace, so a torchrun rendezvous on 127.0.0.1 (the first host's address) joins them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.envs import PveEnv, toml_str
from harness.sshd import SshdServer, free_port
from lifecycle.conftest import CliResult, cli  # noqa: F401 - the in-process CLI fixture, shared


@pytest.fixture(scope="module")
def second_sshd(sshd_server: SshdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    server = SshdServer(tmp_path_factory.mktemp("sshd2"), pct_backend=sshd_server.pct_backend).start()
    try:
        yield server
    finally:
        server.stop()


def _host_table(name: str, env: PveEnv, port: int | None = None) -> str:
    h = env.host
    return (f"[hosts.{name}]\ntransport = \"ssh\"\naddress = {toml_str(h.address)}\nport = {port or h.port}\n"
            "user = \"root\"\n"
            f"identity_file = {toml_str(h.identity_file)}\ncontainer = {h.container}\n"
            "workspace = \"/workspace/dflash\"\npython = \"python3\"\n\n")


MARKED = """
import os, sys
for p in os.listdir("/proc"):
    try:
        env = open(f"/proc/{p}/environ", "rb").read().split(b"\\0") if p.isdigit() else []
    except OSError:
        continue
    if ("DFLASH_RUN_ID=" + sys.argv[1]).encode() in env and int(p) != os.getpid():
        print(p)
"""


@dataclass
class TwoHosts:
    pve1: PveEnv
    pve2: PveEnv
    hosts_file: Path
    port: int  # the cluster's rendezvous port

    def write_hosts(self, *, pve2_port: int | None = None, clusters: str | None = None, pve2_keys: str = "",
                    pve1_port: int | None = None) -> None:
        """hosts.toml: both hosts (either on another port, pve2 with more keys, if given) and [clusters.duo] (or the
        tables given)."""
        self.hosts_file.write_text('default = "pve1"\n\n' + _host_table("pve1", self.pve1, pve1_port)
                                   + _host_table("pve2", self.pve2, pve2_port).rstrip("\n") + f"\n{pve2_keys}\n\n"
                                   + (clusters or f'[clusters.duo]\nhosts = ["pve1", "pve2"]\n'
                                                  f"rendezvous_port = {self.port}\n"))

    def runs_dir(self, env: PveEnv) -> Path:
        return env.workspace_dir / "dflash" / "runs"

    def run_dirs(self, env: PveEnv) -> list[str]:
        d = self.runs_dir(env)
        return sorted(p.name for p in d.iterdir() if p.is_dir() and not p.is_symlink()) if d.is_dir() else []

    def marked(self, env: PveEnv, run_id: str) -> list[str]:
        """Processes in env's container carrying the run's marker (DFLASH_RUN_ID=run_id)."""
        res = env.exec(["python3", "-c", MARKED, run_id])
        return res.stdout.decode().split()


@pytest.fixture
def two_hosts(sshd_server: SshdServer, second_sshd: SshdServer, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch, pct_env_mode: str) -> Iterator[TwoHosts]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pve1 = PveEnv(sshd_server, tmp_path / "a", env_mode=pct_env_mode)
    pve2 = PveEnv(second_sshd, tmp_path / "b", env_mode=pct_env_mode)
    hosts_file = tmp_path / "hosts.toml"
    known = tmp_path / "known_hosts"
    known.write_text(sshd_server.known_hosts.read_text() + second_sshd.known_hosts.read_text())
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(known))
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", "/dev/null")
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(hosts_file))
    both = TwoHosts(pve1, pve2, hosts_file, free_port())
    both.write_hosts()
    try:
        yield both
    finally:  # safety net: nothing of a run of this test outlives it (each marked process, in its container)
        for env in (pve1, pve2):
            for run_id in both.run_dirs(env):
                pids = both.marked(env, run_id)
                if pids:
                    env.exec(["kill", "-9", *pids])
        pve1.close()
        pve2.close()
