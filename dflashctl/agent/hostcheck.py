"""`hosts check`, the Proxmox host side of a container host: what the container's GPU access depends on there.

The container's /etc/pve/lxc/<CTID>.conf (its `lxc.cgroup2.devices.allow` / `lxc.cgroup.devices.allow`, `devN:` and
`lxc.mount.entry` lines), the host's character device majors (/proc/devices: nvidia-uvm's major is assigned when the
module loads, so it differs between hosts and can change on a driver update) and the loaded kernel module's version
(/proc/driver/nvidia/version). The laptop judges (dflashctl/commands/hosts.py). Runs under any Python 3.
Arguments: CTID. $DFLASHCTL_HOST_ROOT (tests only) is the directory those absolute paths are read under.
"""

import os
import re
import sys

from dflashctl.agent.lib.frame import reply

KERNEL_MODULE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)*)")
CONF_KEYS = re.compile(r"^(lxc\.cgroup2?\.devices\.(?:allow|deny)|dev\d+|lxc\.mount\.entry)\s*:\s*(.*)$")


def under_root(path):
    return os.path.join(os.environ.get("DFLASHCTL_HOST_ROOT") or "/", path.lstrip("/"))


def read(path):
    try:
        with open(under_root(path)) as f:
            return f.read()
    except OSError as e:
        return e


def ct_conf(ctid):
    """The conf lines that decide device access, in order: [key, value]; only the current config (a
    `[snapshot]` section that follows describes an old state)."""
    path = "/etc/pve/lxc/" + ctid + ".conf"
    text = read(path)
    if isinstance(text, OSError):
        return {"path": path, "error": str(text.strerror or text), "lines": []}
    lines = []
    for line in text.splitlines():
        if line.startswith("["):
            break
        m = CONF_KEYS.match(line.strip())
        if m:
            lines.append([m.group(1), m.group(2).strip()])
    return {"path": path, "error": None, "lines": lines}


def char_majors():
    """name -> major of the host's character devices (the nvidia ones matter)."""
    text = read("/proc/devices")
    if isinstance(text, OSError):
        return {}
    out, in_char = {}, False
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.startswith("Character")
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            out.setdefault(parts[1], int(parts[0]))
    return out


def kernel_driver():
    """The loaded NVIDIA kernel module's version, or None (no module loaded: no file)."""
    text = read("/proc/driver/nvidia/version")
    if isinstance(text, OSError):
        return None
    m = KERNEL_MODULE.search(text)
    return {"version": m.group(1) if m else None, "line": text.splitlines()[0] if text else ""}


def main(argv):
    ctid = argv[0]
    return reply({"conf": ct_conf(ctid), "majors": char_majors(), "kernel_driver": kernel_driver()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
