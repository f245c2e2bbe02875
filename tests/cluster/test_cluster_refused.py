"""A launch across hosts that must not start: each problem is one line with its exit code, found before anything is
launched, and no run directory appears on any host."""

from __future__ import annotations

import socket

import pytest
from harness.sshd import closed_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _one_line(err: str) -> list[str]:
    lines = [ln for ln in err.splitlines() if ln.startswith("ERROR:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines


def _nothing_anywhere(h) -> None:
    assert h.run_dirs(h.pve1) == [] and h.run_dirs(h.pve2) == []


def test_a_cluster_naming_an_unknown_host(two_hosts, cli):
    h = two_hosts
    h.write_hosts(clusters='[clusters.duo]\nhosts = ["pve1", "pve3"]\n')
    res = cli("launch", "--cluster", "duo")
    assert res.code == 2
    assert "[clusters.duo] hosts: names host 'pve3', which is not defined" in _one_line(res.err)[0]
    _nothing_anywhere(h)
    h.write_hosts()
    res = cli("launch", "--host", "pve1,pve3")
    assert res.code == 2 and "unknown host 'pve3'" in _one_line(res.err)[0]
    _nothing_anywhere(h)
    res = cli("launch", "--hosts", "pve1,pve3")  # --hosts is always the hosts file (issue 25): none of that name
    assert res.code == 2 and "hosts file pve1,pve3 (from --hosts) does not exist" in _one_line(res.err)[0]
    _nothing_anywhere(h)


def test_the_rendezvous_port_in_use_on_the_first_host(two_hosts, cli):
    h = two_hosts
    with socket.socket() as s:  # the containers share this network namespace: the first node sees it taken
        s.bind(("127.0.0.1", h.port))
        s.listen()
        res = cli("launch", "--cluster", "duo")
    assert res.code == 2, res.err
    assert f"rendezvous port {h.port} is in use on pve1" in _one_line(res.err)[0]
    _nothing_anywhere(h)


def test_a_host_that_refuses(two_hosts, cli):
    h = two_hosts
    h.write_hosts(pve2_port=closed_port())
    res = cli("launch", "--cluster", "duo")
    assert res.code == 102, res.err
    line = _one_line(res.err)[0]
    assert "pve2" in line and "nothing launched on any host" in line
    _nothing_anywhere(h)
    # the status of such a cluster's run: tested in test_cluster_run (a node that does not answer is a row)


def test_a_later_node_that_cannot_start_stops_the_ones_started(two_hosts, cli):
    """Node 2's GPU is held by a process of no run (checked as node 2 starts): node 1, already started, is stopped,
    and the one line says so."""
    h = two_hosts
    h.write_hosts(pve2_keys="gpus = { target = [0] }")
    h.pve2.set_gpus([{"memory.used": 88283, "utilization.gpu": 0}])
    res = cli("launch", "--cluster", "duo", "--", "--set", 'devices.drafters=["cpu"]', "--set",
              "runtime.compile_strategy=off")
    assert res.code == 2, res.err
    line = _one_line(res.err)[0]
    assert "node 1 (pve2) did not start" in line and "GPU 0: 88283 MiB" in line, line
    assert "stopped the node(s) already started: pve1" in line, line
    [run_id] = h.run_dirs(h.pve1)
    assert h.run_dirs(h.pve2) == []
    assert h.marked(h.pve1, run_id) == []  # nothing of the half-launched run is left running
    assert (h.runs_dir(h.pve1) / run_id / "exit_code").exists()
