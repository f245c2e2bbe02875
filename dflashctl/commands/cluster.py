"""One run across several hosts: `launch --cluster NAME` / `launch --host pve1,pve2` (issue 17 part 2).

Not a cluster layer of our own: each host runs `torchrun --nnodes N --node-rank i … -m trainer` through the normal
launcher (its own run dir, supervisor, marker, sentinel), the rendezvous on the first host, and torch.distributed does
the rest. Here: which hosts, the pre-flight that must pass on every host before anything starts anywhere, and the
launch in node order that leaves nothing half-started (a later node that fails to start stops the earlier ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflashctl.commands import deploy as deploy_cmd
from dflashctl.commands import launch as launch_cmd
from dflashctl.commands import stop as stop_cmd
from dflashctl.commands.fanout import fan_out
from dflashctl.commands.launch_gpus import node_refusals
from dflashctl.commands.program import LaunchOptions, program_argv
from dflashctl.config import Inventory
from dflashctl.errors import ConfigError, DflashError, ExitCode
from dflashctl.model import Cluster, Host
from dflashctl.remote.target import Target

PREFLIGHT_DEADLINE_S = 60.0  # one host's reachability check; past it the host is reported as not answering
STOP_GRACE_S = 10.0  # a launch that failed half-way ends the nodes it started this fast

_PORT_FREE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.bind(("", int(sys.argv[1])))
except OSError as e:
    print("busy", e.strerror or e)
else:
    print("free")
"""


def resolve(inv: Inventory, host: str | None, cluster: str | None, *, rendezvous_port: int | None = None,
            nproc_per_node: int | None = None) -> Cluster | None:
    """The cluster `--cluster NAME` or `--host a,b` names (None: an ordinary one-host command). Usage errors (2)."""
    if cluster is not None and host is not None:
        raise ConfigError("--cluster and --host both say where to run; give one",
                          hint="--cluster NAME ([clusters.NAME] in hosts.toml), or --host pve1,pve2")
    if cluster is not None:
        found = inv.clusters.get(cluster)
        if found is None:
            raise ConfigError(f"unknown cluster {cluster!r} in {inv.source} (known: "
                              f"{', '.join(inv.clusters) or 'none'})", hint="add it as [clusters.NAME] in hosts.toml")
    elif host is not None and "," in host:
        names = [n.strip() for n in host.split(",")]
        if any(not n for n in names) or len(set(names)) != len(names):
            raise ConfigError(f"--host {host!r}: give distinct host names separated by commas", hint="--host pve1,pve2")
        for n in names:
            inv.get(n)  # an unknown host: the one-line error naming the known ones
        found = Cluster(",".join(names), tuple(names))
    else:
        return None
    return dataclasses.replace(found, rendezvous_port=rendezvous_port or found.rendezvous_port,
                               nproc_per_node=nproc_per_node or found.nproc_per_node)


def rendezvous_address(host: Host) -> str:
    """How the other nodes reach the first node's container: node_address, else the host's address."""
    return host.node_address or host.address or "127.0.0.1"


@dataclass
class ClusterLaunch:
    cluster: Cluster
    run_id: str
    rendezvous: str  # addr:port
    nodes: list[launch_cmd.LaunchResult]
    notes: list[str]

    def to_record(self) -> dict[str, Any]:
        """`launch --cluster … --json`."""
        return {"run_id": self.run_id, "cluster": self.cluster.name, "rendezvous": self.rendezvous,
                "nproc_per_node": self.cluster.nproc_per_node, "notes": self.notes,
                "nodes": [{"node_rank": i, **n.to_record()} for i, n in enumerate(self.nodes)]}


def cluster_meta(cluster: Cluster, node_rank: int, rendezvous: str) -> dict[str, Any]:
    """meta.json `cluster` on every node: who the members are and where they meet."""
    return {"name": cluster.name, "node_rank": node_rank, "nnodes": len(cluster.hosts),
            "nproc_per_node": cluster.nproc_per_node, "rendezvous": rendezvous,
            "members": [{"host": h, "node_rank": i} for i, h in enumerate(cluster.hosts)]}


def torchrun_args(cluster: Cluster, node_rank: int, addr: str) -> list[str]:
    return ["-m", "torch.distributed.run", "--nnodes", str(len(cluster.hosts)), "--node-rank", str(node_rank),
            "--nproc-per-node", str(cluster.nproc_per_node), "--master-addr", addr,
            "--master-port", str(cluster.rendezvous_port)]


def launch(inv: Inventory, cluster: Cluster, opts: LaunchOptions, connect: Callable[[Host], Target], *,
           say: Callable[[str], None] = lambda _m: None) -> ClusterLaunch:
    """Pre-flight on every host, then node 0, 1, … with the same run id; nothing left running when one fails."""
    hosts = [inv.get(n) for n in cluster.hosts]
    if opts.command is not None or opts.shell is not None or program_argv(opts, hosts[0]) is not None:
        raise ConfigError("a run across hosts starts the bundled trainer under torchrun; --exec, --shell and a "
                          "host's `command` are one-host launches", hint="drop --exec/--shell (or the host's "
                                                                         "`command`), or launch on one --host")
    if opts.resume_from is not None:
        raise ConfigError("--resume-from is not supported for a run across hosts yet",
                          hint="launch a fresh run; each node's checkpoints stay in its own run dir")
    addr = rendezvous_address(hosts[0])
    rendezvous = f"{addr}:{cluster.rendezvous_port}"
    targets = [connect(h) for h in hosts]
    notes: list[str] = []
    try:
        _reachable(cluster, targets)
        _port_free(cluster, targets[0])
        if opts.exclude_unhealthy_gpus:  # every node's GPUs judged before any starts (each launch applies it)
            refused = node_refusals(cluster.name, targets, dict(opts.env), lambda i: torchrun_args(cluster, i, addr))
            if refused is not None:
                raise refused
        for t in targets:  # every host's way cleared and code current before any node starts
            launch_cmd._clear_the_way(t, opts, notes, say)  # noqa: SLF001 - the one copy of that check
            state = deploy_cmd.check(t, opts.source)
            if not state.current:
                done = deploy_cmd.deploy(t, opts.source, state=state)
                notes.append(f"{t.host.name}: deployed {done.hash[:12]} ({done.files} files)")
                say(notes[-1])
        started: list[launch_cmd.LaunchResult] = []
        run_id: str | None = None
        for i, t in enumerate(targets):
            node_opts = dataclasses.replace(opts, run_id=run_id, runner=torchrun_args(cluster, i, addr), confirm=False,
                                            meta={**opts.meta, "cluster": cluster_meta(cluster, i, rendezvous)})
            try:
                res = launch_cmd.launch(t, node_opts, say=say)
            except DflashError as e:
                raise _undo(targets, started, f"node {i} ({t.host.name}) did not start: {e.message}", e) from None
            started.append(res)
            run_id = res.run_id
        assert run_id is not None
        if opts.confirm:  # every node at once: each is alive with its log, or the run is stopped everywhere
            for i, e in enumerate(fan_out(targets, lambda t: _confirm(t, run_id, opts.confirm_s), _late,
                                          deadline_s=PREFLIGHT_DEADLINE_S)):
                if e is not None:
                    raise _undo(targets, started, f"node {i} ({targets[i].host.name}) died at start: {e.message}",
                                e) from None
        return ClusterLaunch(cluster, run_id, rendezvous, started, notes)
    finally:
        for t in targets:
            t.close()


def _confirm(t: Target, run_id: str, within_s: float | None) -> DflashError | None:
    try:
        launch_cmd.confirm(t, run_id, within_s)
        return None
    except DflashError as e:
        return e


def _late(t: Target, seconds: float) -> DflashError:
    return DflashError(f"host {t.host.name}: no answer within {seconds:g} s", exit_code=ExitCode.NOT_FOUND)


def _reachable(cluster: Cluster, targets: list[Target]) -> None:
    """Every host answers and its container runs; else one line naming the first that does not (nothing started)."""
    def one(t: Target) -> DflashError | None:
        try:
            t.ensure_running()
            t.run(["true"], timeout=30).check(f"reaching {t.host.name}")
            return None
        except DflashError as e:
            return e

    for e in fan_out(targets, one, _late, deadline_s=PREFLIGHT_DEADLINE_S):
        if e is not None:
            raise DflashError(f"cluster {cluster.name}: {e.message} (nothing launched on any host)",
                              hint=e.hint, exit_code=e.exit_code)


def _port_free(cluster: Cluster, first: Target) -> None:
    """The rendezvous port must be free where node 0's torchrun will listen: checked in its container."""
    res = first.python(_PORT_FREE, str(cluster.rendezvous_port), timeout=30)
    res.check(f"checking the rendezvous port on {first.host.name}")
    answer = res.stdout.decode(errors="replace").strip()
    if answer != "free":
        raise ConfigError(f"rendezvous port {cluster.rendezvous_port} is in use on {first.host.name} "
                          f"({answer.removeprefix('busy ')}); nothing launched on any host",
                          hint="pick a free one: rendezvous_port in [clusters.NAME], or --rendezvous-port PORT")


def _undo(targets: list[Target], started: list[launch_cmd.LaunchResult], what: str, e: DflashError) -> DflashError:
    """Stop the nodes already started (a half-launched run must not hold GPUs waiting for a rendezvous)."""
    stopped, failed = [], []
    for t, res in zip(targets, started, strict=False):
        try:
            stop_cmd.stop(t, res.run_id, grace_s=STOP_GRACE_S)
            stopped.append(t.host.name)
        except stop_cmd.NotRunning:
            stopped.append(t.host.name)  # it had ended already (its rendezvous failed): nothing left running
        except DflashError as err:
            failed.append(f"{t.host.name} ({err.message})")
    tail = f"; stopped the node(s) already started: {', '.join(stopped)}" if stopped else ""
    if failed:
        tail += f"; could NOT stop: {', '.join(failed)}"
    return DflashError(what + tail, hint=e.hint, exit_code=e.exit_code)
