"""On the GPU host: the host half of a one-shot status (stdlib only) — the kernel log's Xid lines and, with --apps,
who holds the GPUs as the driver knows them — in ONE interpreter.

A container host's one-shot `status` needs readings from both sides of `pct exec`: the run (inside the container)
and, on the Proxmox host, the NVIDIA Xid lines of the kernel log (an LXC container may not read the host's ring
buffer) and the GPUs' compute processes for the GPU share (issue 29: nvidia-smi lists processes only where the
driver's pids are real). The laptop runs the container probe and this program (the agent archive's `hostpair` verb,
[--apps]) at the same moment (remote/probe.py _halves_at_once), so the two cost one round trip. Here the kernel-log
read (probe/xid.py) and the compute apps with their /proc facts (probe/gpuapps.py) run at once, and one frame
stamped with the probe's version carries both: {"probe_version", "half": "host", "xid", "gpu_apps"}. The GPUs
themselves are the container probe's reading (the laptop places the apps on them by uuid), not read again here.
(This was two interpreters on the host, the second also reading the GPUs and scanning every process for
/dev/nvidia* holders: ~110 ms more CPU per status, and on a loaded 2-core machine CPU is wall time.)

Compute apps still being read GPU_WAIT_S after the kernel log was read are left out (a wedged driver holds
nvidia-smi for its whole timeout; the Xid lines that say why must not wait for it): gpu_apps is then {"error": ...}.
A read that fails leaves its piece out, and the laptop says so (the report's xid note; no GPU share).
"""

import contextlib
import sys
import threading

from dflashctl.agent.lib.frame import frame
from dflashctl.agent.probe.gpuapps import apps_reading
from dflashctl.agent.probe.version import PROBE_VERSION
from dflashctl.agent.probe.xid import xid_report

GPU_WAIT_S = 5.0  # what status waited for its GPU share after the probe answered, when it was a request of its own


def _apps_into(got: dict) -> None:
    try:
        got["value"] = apps_reading()
    except Exception as e:  # noqa: BLE001 - any failure: the share is left out, the Xid lines still go
        got["error"] = f"{type(e).__name__}: {e}"


def main(argv: list) -> int:
    if argv not in ([], ["--apps"]):
        print("hostpair: usage: hostpair [--apps]", file=sys.stderr)
        return 2
    doc = {"probe_version": PROBE_VERSION, "half": "host"}
    got: dict = {}
    side = threading.Thread(target=_apps_into, args=(got,), name="gpu-apps", daemon=True) if argv else None
    if side is not None:
        side.start()
    with contextlib.suppress(Exception):  # left out: the laptop notes the missing reading
        doc["xid"] = xid_report()
    if side is not None:
        side.join(GPU_WAIT_S)
        doc["gpu_apps"] = got.get("value") or {"error": got.get("error") or
                                               f"the GPU processes were still being read after {GPU_WAIT_S:g} s"}
    with contextlib.suppress(Exception):
        sys.stdout.buffer.write((frame(doc) + "\n").encode())
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
