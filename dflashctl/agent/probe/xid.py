"""The kernel log's NVIDIA Xid lines (stdlib only): run where the kernel log is readable, the Proxmox host for a
container (an LXC container may not read the host's ring buffer, and its journal is its own).

xid_report() -> {"source": "dmesg" | "journalctl" | None, "lines": [raw line, newest last, at most max_lines],
"error": str | None}. `dmesg --time-format iso` first (plain `dmesg` where that option is unknown, as in busybox),
then `journalctl -k -o short-iso --no-pager` (this boot's kernel messages) when dmesg is not permitted
(`dmesg: read kernel buffer failed: Operation not permitted`, kernel.dmesg_restrict=1) or absent. Lines pass
through as the tool printed them (the laptop parses them).
"""

from __future__ import annotations

import subprocess

# the driver's Xid reports, and the bus-loss message it prints without an Xid number (analysis/xids.py counts
# that as Xid 79)
XID_MARKS = ("NVRM: Xid", "fallen off the bus", "NVRM: The NVIDIA GPU")
XID_TIMEOUT_S = 15
_DMESG_ARGVS = (["dmesg", "--time-format", "iso"], ["dmesg"])
_JOURNAL_ARGV = ["journalctl", "-k", "-o", "short-iso", "--no-pager"]


def xid_report(max_lines: int = 200) -> dict:
    errors: list[str] = []
    for argv in _DMESG_ARGVS:
        out, err = _xid_run(argv)
        if out is not None:
            return {"source": "dmesg", "lines": _xid_lines(out, max_lines), "error": None}
        errors.append(err)
        if err.startswith("dmesg: not found") or "not permitted" in err.lower() or "denied" in err.lower():
            break  # plain dmesg would fail the same way
    out, err = _xid_run(_JOURNAL_ARGV)
    if out is not None:
        # an unprivileged journalctl prints what it may and says so on stderr: keep both
        return {"source": "journalctl", "lines": _xid_lines(out, max_lines), "error": err or None}
    errors.append(err)
    return {"source": None, "lines": [], "error": "; ".join(errors)}


def _xid_run(argv: list[str]) -> tuple[str | None, str]:
    """(stdout, stderr's notice) on exit 0, else (None, why)."""
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=XID_TIMEOUT_S)
    except FileNotFoundError:
        return None, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]}: timed out after {XID_TIMEOUT_S}s"
    err = res.stderr.decode("utf-8", "replace").strip()
    if res.returncode != 0:
        tail = " | ".join(err.splitlines()[-2:]) or res.stdout.decode("utf-8", "replace").strip()[-200:]
        return None, tail or f"{argv[0]}: exit {res.returncode}"
    notice = err.splitlines()[0] if err else ""
    return res.stdout.decode("utf-8", "replace"), notice


def _xid_lines(text: str, max_lines: int) -> list[str]:
    found = [line.rstrip("\r") for line in text.splitlines() if any(m in line for m in XID_MARKS)]
    return found[-max_lines:] if max_lines > 0 else []
