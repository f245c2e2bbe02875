"""How bytes reach the container: a Transport (local | ssh) under a Target (host | pct exec)."""

from __future__ import annotations

from dflashctl.model import Host
from dflashctl.remote.target import Target
from dflashctl.remote.transport import LocalTransport, Result, Transport, shell_join

__all__ = ["Result", "Target", "Transport", "LocalTransport", "connect", "shell_join"]


def connect(host: Host) -> Target:
    """A Target for host. SSH connects lazily, on the first command, and is reused until close()."""
    if host.transport == "ssh":
        from dflashctl.remote.ssh import SshTransport

        return Target(host, SshTransport(host))
    return Target(host, LocalTransport())
