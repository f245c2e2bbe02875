"""When a watch across hosts may end (commands/cluster_watch.settled): a member whose run, container or host is gone
for good no longer holds the watch open once the others have ended; one that was merely unreachable this time does
(it is retried). Views are judged from probe-shaped reports (tests/status/test_watcher.py's shape)."""

from __future__ import annotations

import base64

from dflashctl.commands.cluster_runs import NodeRow, judge
from dflashctl.commands.cluster_watch import settled
from dflashctl.commands.status import Watcher
from dflashctl.errors import ExitCode
from dflashctl.report import parse_report

CLUSTER = {"members": [{"host": "pve1", "node_rank": 0}, {"host": "pve2", "node_rank": 1}], "node_rank": 0}


def finished_view():
    data = b"step=1 loss=3.0 tok/s=100.0\ntraining finished\n"
    doc = {"probe_version": 1, "time": 100.0, "hostname": "ct200",
           "run": {"id": "r1", "dir": "/ws/runs/r1", "meta": {"started_at_epoch": 0.0}, "pid": 42, "alive": False,
                   "exit_code": 0, "stopped": False, "heartbeat": None, "errors": {}},
           "log": {"path": "/ws/runs/r1/train.log", "size": len(data), "inode": 7, "offset": 0,
                   "next_offset": len(data), "data_b64": base64.b64encode(data).decode(), "rotated": False}}
    view = Watcher("pve1", live=True).update(parse_report(doc))
    assert view.health.verdict.is_terminal
    return view


def rows(second: NodeRow) -> list[NodeRow]:
    return [NodeRow("pve1", 0, finished_view()), second]


def test_a_member_gone_for_good_lets_the_watch_end_with_its_code() -> None:
    gone = NodeRow("pve2", 1, error="run r1 is gone from pve2", exit_code=int(ExitCode.NOT_FOUND), final=True)
    cs = judge("r1", CLUSTER, rows(gone))
    assert settled(cs, expected=2, exit_on_failure=False)
    assert cs.exit_code == int(ExitCode.NOT_FOUND)


def test_a_member_unreachable_this_time_keeps_the_watch_open() -> None:
    unreachable = NodeRow("pve2", 1, error="cannot reach pve2", exit_code=int(ExitCode.NOT_FOUND))
    assert not settled(judge("r1", CLUSTER, rows(unreachable)), expected=2, exit_on_failure=False)


def test_every_member_ended_ends_the_watch_and_one_missing_does_not() -> None:
    both = judge("r1", CLUSTER, [NodeRow("pve1", 0, finished_view()), NodeRow("pve2", 1, finished_view())])
    assert settled(both, expected=2, exit_on_failure=False) and both.exit_code == 0
    assert not settled(judge("r1", CLUSTER, rows(NodeRow("pve2", 1))[:1]), expected=2, exit_on_failure=False)
