"""`status` of a run across hosts against the same status of a one-host run: does asking every node cost one round?

    .venv/bin/python benchmarks/cluster_status.py [--calls 7] [--out FILE]

Needs root and OpenSSH's sshd (the test harness): two real sshd on 127.0.0.1, each with its own `pct` stand-in
container, a live run printing progress in each under one run id, its meta.json naming both as a cluster. Each call
is a new `dflashctl status RUN --json` process with warm connection masters. Rows: the run asked as one host's (its
meta.json without `cluster`), as a two-node run (both nodes asked at once), and as a two-node run whose second host
refuses connections (a row saying so). Ratios are against the one-host row of the same run; both hosts share this
machine's CPUs, which real hosts do not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from loopback import DFLASHCTL, PveEnv, SshdServer, start_in_container, summary, timed, why_sshd_cannot_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster.conftest import _host_table  # noqa: E402
from harness.sshd import closed_port  # noqa: E402

RUN = "20261201-120000-duo"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    why = why_sshd_cannot_run()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="dflash-cluster-bench-"))
    servers = [SshdServer(tmp / f"sshd{i}").start() for i in (1, 2)]
    envs: list[PveEnv] = []
    try:
        for i, s in enumerate(servers, 1):
            (tmp / f"h{i}").mkdir()
            envs.append(PveEnv(s, tmp / f"h{i}"))
        known = tmp / "known_hosts"
        known.write_text("".join(s.known_hosts.read_text() for s in servers))
        hosts = tmp / "hosts.toml"
        env = {**os.environ, "DFLASHCTL_KNOWN_HOSTS": str(known), "DFLASHCTL_SSH_CONFIG": os.devnull,
               "DFLASHCTL_HOSTS": str(hosts), "DFLASHCTL_STATE_DIR": str(tmp / "state")}
        run_dirs = [start_in_container(e, RUN, step_s=0.05) for e in envs]
        cluster = {"name": "duo", "node_rank": 0, "nnodes": 2, "nproc_per_node": 1, "rendezvous": "127.0.0.1:29500",
                   "members": [{"host": "pve1", "node_rank": 0}, {"host": "pve2", "node_rank": 1}]}

        def meta(with_cluster: bool) -> None:
            for rank, d in enumerate(run_dirs):
                m = json.loads((d / "meta.json").read_text())
                m.pop("cluster", None)
                if with_cluster:
                    m["cluster"] = {**cluster, "node_rank": rank}
                (d / "meta.json").write_text(json.dumps(m))

        def write_hosts(pve2_port: int | None = None) -> None:
            hosts.write_text('default = "pve1"\n\n' + _host_table("pve1", envs[0])
                             + _host_table("pve2", envs[1], pve2_port))

        rows = []
        for label, with_cluster, port in (("one host (meta without cluster)", False, None),
                                          ("two nodes (asked at once)", True, None),
                                          ("two nodes, node 2 refuses", True, closed_port())):
            meta(with_cluster)
            write_hosts(port)
            argv = [str(DFLASHCTL), "status", RUN, "--json"]
            timed(argv, env)  # warm: connection masters up, page cache
            secs = []
            for _ in range(args.calls):
                s, out = timed(argv, env)
                doc = json.loads(out.decode().strip().splitlines()[-1])
                assert len(doc.get("nodes", [None])) == (2 if with_cluster else 1), doc
                secs.append(s)
            rows.append((label, *summary(secs)))
        base = rows[0][1]
        lines = [f"cluster status: {args.calls} calls per row, new process each, warm connection masters",
                 "", f"{'case':<34} {'median s':>9} {'best s':>8} {'x one host':>11}"]
        lines += [f"{label:<34} {med:>9.3f} {best:>8.3f} {med / base:>11.2f}" for label, med, best in rows]
        text = "\n".join(lines) + "\n"
        print(text, end="")
        if args.out:
            args.out.write_text(text)
        return 0
    finally:
        from dflashctl.remote.masterclient import end_master, list_masters

        for m in list_masters(tmp / "state" / "masters"):
            end_master(m)
        for e in envs:
            e.close()
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
