"""What the host view costs (issue 29): `gpus --json`, and `status --json` with its GPU share read beside the probe
against the same status without it, next to the seed's raw one-liner, on the loopback Proxmox stand-in.

    .venv/bin/python benchmarks/gpus_share.py [--calls 9] [--out benchmarks/results/gpus_share.md]

Loopback sshd + a running container + the nvidia-smi stand-in (benchmarks/loopback.py), a run frozen on a 700 kB
log, its trainer's host pid listed by the stand-in as a compute app. "status, no share" is the same dflashctl with
the status request's host half asked without the GPUs' compute processes (remote/probe.py request_doc
gpu_apps=False) (in the process, before the verb runs). Rows
alternate call by call (each a new process); medians and bests. Numbers are from one run on one machine: compare the
ratios, not the seconds. Needs root and sshd.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from loopback import (
    DFLASHCTL,
    frozen_run,
    loopback_pve,
    publish,
    raw_oneliner,
    result_path,
    sshd_missing,
    summary,
    timed,
)

NO_SHARE = ("import sys\nfrom dflashctl.remote import probe\n_ask = probe.request_doc\n"
            "probe.request_doc = lambda *a, **k: _ask(*a, **{**k, 'gpu_apps': False})\n"
            "from dflashctl.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--out", default=result_path("gpus_share.md"))
    args = ap.parse_args()
    if sshd_missing():
        return 2
    with loopback_pve("dflash-bench-gpus-") as (sshd, pve):
        run_dir = frozen_run(pve, "20261203-110000-bench")
        ns_pid = int((run_dir / "pid").read_text())
        host_pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _nspid(int(p))[-1:] == [ns_pid]
                        and len(_nspid(int(p))) > 1)
        pve.set_gpus([{"memory.used": 70000, "utilization.gpu": 97}, {"memory.used": 512}],
                     processes=[{"pid": host_pid, "used_memory": 70000, "gpu": 0}])
        env = {**os.environ, "DFLASHCTL_NO_SERVER": "1"}
        rows = {
            "raw one-liner (ssh … pct exec … grep; nvidia-smi)": raw_oneliner(sshd, pve, run_dir),
            "status --json, no share": [sys.executable, "-c", NO_SHARE, "status", "--json"],
            "status --json (share read beside the probe)": [str(DFLASHCTL), "status", "--json"],
            "gpus --json": [str(DFLASHCTL), "gpus", "--json"],
        }
        checks = {"status --json (share read beside the probe)": lambda doc: doc["gpu_share"][0]["ours_mib"] == 70000,
                  "gpus --json": lambda doc: doc["gpus"][0]["processes"][0]["run"] == "current"}
        for argv in rows.values():
            timed(argv, env)  # bytecode caches, the first connection's host key
        seconds: dict[str, list[float]] = {k: [] for k in rows}
        for _ in range(args.calls):
            for name, argv in rows.items():
                s, out = timed(argv, env)
                if name in checks and not checks[name](json.loads(out)):
                    raise SystemExit(f"{name}: wrong answer: {out[:300]!r}")
                seconds[name].append(s)
    base = summary(seconds["status --json, no share"])[0]
    lines = ["# The host view's cost (benchmarks/gpus_share.py)", "",
             f"{args.calls} calls per row, alternating; each a new process over the loopback sshd.", "",
             "| row | median s | best s | median vs status without share |", "|---|---|---|---|"]
    for name, xs in seconds.items():
        med, best = summary(xs)
        lines.append(f"| {name} | {med:.3f} | {best:.3f} | {med / base:.2f}x |")
    return publish(lines, args.out)


def _nspid(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(([int(x) for x in line.split()[1:]] for line in f if line.startswith("NSpid:")), [])
    except (OSError, ValueError):
        return []


if __name__ == "__main__":
    sys.exit(main())
