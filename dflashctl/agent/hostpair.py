"""On the Proxmox host: the kernel-log half of a container host's one-shot status (stdlib only).

A container host's one-shot `status` needs two readings that live on two sides of `pct exec`: the run (inside the
container) and the NVIDIA Xid lines of the kernel log (on the host: an LXC container may not read the host's ring
buffer). The laptop sends the two as requests at the same moment (remote/probe.py _halves_at_once): the container
probe, and `python3 -c <this>`, which prints the kernel-log reply (probe/xid.py, pasted in: not the whole probe) as
one frame stamped with the probe's version. A read that fails prints nothing, and the laptop says so in the
report's xid note. (It used to run both halves in one command, `pct exec` from here: two interpreter starts in a
row, 204-212 ms against 145 ms for the two requests at once.)
"""

import contextlib
import sys

from dflashctl.agent.lib.frame import frame
from dflashctl.agent.probe.version import PROBE_VERSION
from dflashctl.agent.probe.xid import xid_report


def main(argv: list) -> int:
    if argv:
        print("hostpair: no arguments expected (the kernel-log half only)", file=sys.stderr)
        return 2
    with contextlib.suppress(Exception):  # left out: the laptop notes the missing reading
        sys.stdout.buffer.write((frame({"probe_version": PROBE_VERSION, "xid": xid_report()}) + "\n").encode())
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
