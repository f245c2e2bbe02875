"""One run across two simulated Proxmox hosts: `launch --cluster` / `--host a,b` starts torchrun on each (the bundled
trainer, gloo on the CPU), `status` judges the run as a whole, a crash on node 2 names it, `stop` ends both."""

from __future__ import annotations

import json

import pytest
from harness.poll import wait_until
from harness.sshd import closed_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# small and eager: two drafter threads a node, one process a node, one step a log line
TRAIN = ["--", "--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set", "train.seq_len=64",
         "--set", "train.log_interval=1", "--set", 'devices.drafters=["cpu","cpu"]', "--set",
         "runtime.heartbeat_interval_s=0.2"]


def _meta(hosts, env, run_id: str) -> dict:
    return json.loads((hosts.runs_dir(env) / run_id / "meta.json").read_text())


@pytest.mark.both_env_modes
def test_launch_across_two_hosts_trains_shows_both_nodes_and_stop_ends_both(two_hosts, cli):
    h = two_hosts
    res = cli("launch", "--host", "pve1,pve2", "--rendezvous-port", str(h.port), "--name", "duo run", "--json", *TRAIN,
              "--set", "train.steps=100000")
    assert res.code == 0, res.err
    doc = res.json()
    run_id = doc["run_id"]
    assert [n["host"] for n in doc["nodes"]] == ["pve1", "pve2"]
    assert [n["run_id"] for n in doc["nodes"]] == [run_id, run_id]
    assert h.run_dirs(h.pve1) == [run_id] and h.run_dirs(h.pve2) == [run_id]
    for rank, env in enumerate((h.pve1, h.pve2)):
        meta = _meta(h, env, run_id)
        c = meta["cluster"]
        assert c["members"] == [{"host": "pve1", "node_rank": 0}, {"host": "pve2", "node_rank": 1}]
        assert c["node_rank"] == rank and c["rendezvous"] == f"127.0.0.1:{h.port}"
        argv = meta["argv"]
        assert argv[1:3] == ["-m", "torch.distributed.run"] and argv[argv.index("--node-rank") + 1] == str(rank)

    def training() -> dict | None:
        st = cli("status", run_id, "--json")
        d = st.json() if st.out.strip() else {}
        return d if d.get("verdict") == "training" else None

    st = wait_until(training, timeout=180, every=1.0, what="the run across both hosts training")
    assert [(n["host"], n["node_rank"]) for n in st["nodes"]] == [("pve1", 0), ("pve2", 1)]
    assert all(n["error"] is None for n in st["nodes"])
    assert st["nodes"][0]["progress"]["step"] >= 1
    table = cli("status", run_id, "--cluster", "duo")
    assert table.code == 0 and "pve1" in table.out and "pve2" in table.out and "training" in table.out, table.out
    # each node's own threads: node 2's trainer (global rank 1) keeps its heartbeat in <run>/rank-1/
    for n in st["nodes"]:
        assert sorted(t["name"] for t in n["threads"]) == ["coordinator", "drafter-0", "drafter-1"], n
    rows = [ln.split() for ln in table.out.splitlines() if ln.split()[:2] in (["0", "pve1"], ["1", "pve2"])]
    assert [r[4] for r in rows] == ["3/3", "3/3"], table.out

    logs = cli("logs", run_id, "-n", "5", "--host", "pve1,pve2")
    assert logs.code == 0 and "[pve1] " in logs.out and "[pve2] " in logs.out, logs.out
    only2 = cli("logs", run_id, "--node", "pve2", "-n", "5")
    assert only2.code == 0 and "[pve1]" not in only2.out

    h.write_hosts(pve2_port=closed_port())  # node 2 stops answering: a row saying so, not a hang
    cut = cli("status", run_id, "--json")
    assert cut.code == 102, cut.err
    rows = {n["host"]: n for n in cut.json()["nodes"]}
    assert rows["pve1"]["verdict"] == "training" and "pve2" in rows["pve2"]["error"]
    assert cut.json()["verdict"] == "training" and any(r.startswith("pve2 (node 1): ") for r in cut.json()["reasons"])
    # the members given: every node asked in one round, so a first host that does not answer is a row, the others
    # judged (the two-round path, which reads the members from the first host's run, could not answer at all)
    h.write_hosts(pve1_port=closed_port())
    first_cut = cli("status", run_id, "--host", "pve1,pve2", "--json")
    assert first_cut.code == 102, first_cut.err
    rows = {n["host"]: n for n in first_cut.json()["nodes"]}
    assert "pve1" in rows["pve1"]["error"] and rows["pve2"]["run"]["id"] == run_id, rows
    assert cli("status", run_id, "--json").code == 102  # the first host alone: nothing to read the members from
    h.write_hosts()

    stopped = cli("stop", run_id, "--json", "--grace", "10", "--host", "pve1,pve2")
    assert stopped.code == 103, stopped.err
    # torchrun ends 1 on SIGTERM; a node our stop ended records the clean stop's 143, as a one-host run
    assert [(n["host"], n["exit_code"]) for n in stopped.json()["nodes"]] == [("pve1", 143), ("pve2", 143)]
    for env in (h.pve1, h.pve2):
        assert h.marked(env, run_id) == []
        assert (h.runs_dir(env) / run_id / "exit_code").read_text() == "143\n"
    after = cli("status", run_id, "--json").json()
    assert after["verdict"] == "stopped" and [n["verdict"] for n in after["nodes"]] == ["stopped", "stopped"]
    assert [n["exit_code"] for n in after["nodes"]] == [103, 103] and after["exit_code"] == 103
    zombies = cli("kill-zombies", "--host", "pve1,pve2", "--dry-run", "--json")
    assert zombies.code == 0, zombies.err
    assert [(x["host"], x["error"], x["dry_run"]) for x in zombies.json()["hosts"]] == [("pve1", None, True),
                                                                                      ("pve2", None, True)]


def test_a_crash_on_node_2_makes_the_run_crashed_naming_node_2(two_hosts, cli):
    h = two_hosts
    # the fault hook's `R/` prefix: global rank 1 only, which (one process a node) is node 2's trainer
    res = cli("launch", "--host", "pve1,pve2", "--rendezvous-port", str(h.port), "--json",
              "--env", "DFLASH_FAULT=1/drafter-1@3", *TRAIN, "--set", "train.steps=100000")
    assert res.code == 0, res.err
    run_id = res.json()["run_id"]

    # the live view: every node's stream at once (one connection per host), until both have ended
    watched = cli("status", run_id, "--watch", "--cluster", "duo", "--json", "--interval", "0.5")
    assert watched.code == 100, watched.err
    views = [json.loads(ln) for ln in watched.out.splitlines()]
    assert {n["host"] for v in views for n in v["nodes"]} == {"pve1", "pve2"}
    assert [n["verdict"] for n in views[-1]["nodes"]] == ["crashed", "crashed"]
    assert views[-1]["verdict"] == "crashed" and views[-1]["failed_node"] == "pve2"

    st = cli("status", run_id, "--json").json()
    assert st["verdict"] == "crashed" and st["exit_code"] == 100
    assert st["failed_node"] == "pve2", [(n["host"], n["root_cause"], n["reasons"], n["threads"]) for n in st["nodes"]]
    assert st["reasons"][0].startswith("node pve2 failed first"), st["reasons"]
    table = cli("status", run_id)
    assert table.code == 100 and "node pve2 failed first" in table.out, table.out
    # the table watch (the one --watch loop of cli/live.py): the run has ended, so the final view, printed once
    drawn = cli("status", run_id, "--watch", "--host", "pve1,pve2", "--interval", "0.5")
    assert drawn.code == 100 and "node pve2 failed first" in drawn.out, drawn.out
    assert "pve1" in drawn.out and "pve2" in drawn.out and "crashed" in drawn.out
