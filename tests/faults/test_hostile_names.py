"""Names a hostile container sends back (a run id, a cluster member) are checked by analysis/safe_names.py before
the laptop shows them, asks for them again or builds anything from them: one line naming the host, exit 100."""

from __future__ import annotations

import json

import pytest

from dflashctl.analysis.safe_names import MalformedReply, is_safe_name, safe_name
from faults.hostenv import RUN_ID, hostile_host


@pytest.fixture
def run_dir(local_host, tmp_path):
    d = hostile_host(local_host, tmp_path)
    (d.parent / "latest").symlink_to(RUN_ID)
    return d


@pytest.mark.parametrize("argv", [["logs", RUN_ID], ["logs", "--errors", RUN_ID], ["logs", "--events", RUN_ID],
                                  ["stacks", RUN_ID]])
def test_a_run_id_with_an_escape_sequence_is_refused_by_logs_and_stacks(run_dir, cli, monkeypatch, argv):
    monkeypatch.setenv("HOSTILE_RUN_ID", "run\x1b]0;owned\x07")
    res = cli(*argv)
    assert res.code == 100, (res.code, res.err)
    assert res.err.splitlines()[0] == ("ERROR: host local sent a malformed run id: 'run\\x1b]0;owned\\x07' "
                                       "(expected letters, digits, '.', '_', '-')")
    assert "\x1b" not in res.out + res.err and "Traceback" not in res.err


def test_a_cluster_member_that_is_a_path_is_a_row_error_naming_the_host_that_sent_it(run_dir, cli, monkeypatch):
    monkeypatch.setenv("HOSTILE_MEMBERS", json.dumps([{"host": "local", "node_rank": 0},
                                                      {"host": "../../x\x1b[2J", "node_rank": 1}]))
    res = cli("status", "--json")
    doc = res.json()
    bad = [n for n in doc["nodes"] if n["node_rank"] == 1][0]
    assert "host local sent a malformed cluster member host name" in bad["error"], bad
    assert "\x1b" not in res.out.replace("\\u001b", "") and "Traceback" not in res.err
    logs = cli("logs")
    assert "host local sent a malformed cluster member host name" in logs.err and "\x1b" not in logs.err


@pytest.mark.parametrize("name", ["20261203-101010-tiny", "a", "run_1.2-x", "pve1", "x" * 200])
def test_plain_names_pass(name):
    assert is_safe_name(name) and safe_name(name, "run id", "h") == name


@pytest.mark.parametrize("name", ["", ".", "..", ".x", "a/b", "../a", "/abs", "a b", "a\nb", "a\x00b", "x" * 201,
                                  "é", None, 5, ["a"]])
def test_everything_else_is_a_malformed_reply_naming_the_host(name):
    with pytest.raises(MalformedReply) as e:
        safe_name(name, "run id", "pve1")
    assert e.value.message.startswith("host pve1 sent a malformed run id: ") and "\n" not in e.value.message
    assert int(e.value.exit_code) == 100
