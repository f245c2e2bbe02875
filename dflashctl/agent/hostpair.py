"""On the Proxmox host: the container's probe and the host's kernel-log probe from ONE ssh command (stdlib only).

A container host's one-shot `status` needs two readings that live on two sides of `pct exec`: the run (inside the
container) and the NVIDIA Xid lines of the kernel log (on the host: an LXC container may not read the host's ring
buffer). Sent as `python3 -c <this> CTID PYTHON LOADER ARGS...` with the probe script on stdin, it runs both at
once — `pct exec CTID -- PYTHON -c LOADER ARGS...` (LOADER: agent/codecache.py, which runs the probe from its
compiled-code cache) and the kernel-log read (probe/xid.py, pasted in: no second interpreter, no second copy of
the probe) in a thread beside it — and prints the kernel-log reply first, then the container probe's output, so
the laptop pays one round trip. Exit status: the container probe's (so the laptop's `pct status` check after a
failure reads it as today). A kernel-log read that fails or hangs (past XID_TIMEOUT_S) is left out, and the laptop
says so in the report's xid note. `python3 -c <this> --xid-only` prints the kernel-log reply alone: through a
connection master the laptop sends the two halves to the resident runners at once (remote/probe.py).
"""

import contextlib
import subprocess
import sys
import threading

from dflashctl.agent.lib.frame import frame
from dflashctl.agent.probe.version import PROBE_VERSION
from dflashctl.agent.probe.xid import xid_report

XID_TIMEOUT_S = 20.0


def _feed(stream, data: bytes) -> None:  # noqa: ANN001 - a pipe
    try:
        stream.write(data)
        stream.close()
    except OSError:
        pass  # the program ended without reading (it failed to start): its exit status says why


def _xid(out: list) -> None:
    """The host's kernel-log reply line into out (nothing when the read fails)."""
    with contextlib.suppress(Exception):  # left out: the laptop notes the missing reading
        out.append((frame({"probe_version": PROBE_VERSION, "xid": xid_report()}) + "\n").encode())


def main(argv: list) -> int:
    if argv == ["--xid-only"]:  # the kernel-log half alone (through a master, the laptop runs the halves apart)
        xid: list = []
        _xid(xid)
        sys.stdout.buffer.write(b"".join(xid))
        return 0
    ct, python, loader, args = argv[0], argv[1], argv[2], argv[3:]
    src = sys.stdin.buffer.read()
    xid: list = []
    side = threading.Thread(target=_xid, args=(xid,), daemon=True)
    side.start()
    try:
        proc = subprocess.Popen(["pct", "exec", ct, "--", python, "-c", loader, *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
    except OSError as e:
        print(f"hostpair: cannot run pct: {e}", file=sys.stderr)
        return 127
    threading.Thread(target=_feed, args=(proc.stdin, src), daemon=True).start()
    stdout = proc.stdout.read()
    code = proc.wait()
    side.join(XID_TIMEOUT_S)
    out = sys.stdout.buffer
    if xid:
        out.write(xid[0])
    out.write(stdout)
    out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
