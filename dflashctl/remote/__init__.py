"""How bytes reach the container: a Transport (local | ssh) under a Target (host | pct exec)."""

from __future__ import annotations

from dflashctl.model import Host
from dflashctl.remote.target import Target
from dflashctl.remote.transport import LocalTransport, Result, Transport, shell_join

__all__ = ["Result", "Target", "Transport", "LocalTransport", "connect", "shell_join"]


def connect(host: Host) -> Target:
    """A Target for host. SSH connects lazily, on the first command, and is reused until close(); with `persist`
    (the default) through the host's connection master, so later commands reuse it too (remote/master.py)."""
    if host.transport == "ssh":
        if host.persist_s > 0:
            from dflashctl.remote import masterwire

            place = masterwire.place_for(host)
            if masterwire.fits(place):  # else (a very deep state dir) in-process, as with persist = 0
                from dflashctl.remote.masterclient import MasterTransport

                return Target(host, MasterTransport(host, place))
        from dflashctl.remote.ssh import SshTransport

        return Target(host, SshTransport(host))
    return Target(host, LocalTransport())
