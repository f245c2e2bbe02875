"""`hosts check`, the container side: the python, nvidia-smi, whether the workspace is writable, free disk, py-spy.

One report (lib/frame.py) judged on the laptop by dflashctl/commands/hosts.py. Runs under any Python 3 (no
f-strings, no annotations): its job is to report an interpreter too old for the rest, not to fail on one.
Argument: the workspace.
"""

import os
import shutil
import subprocess
import sys
import tempfile

from dflashctl.agent.lib.frame import reply


def nvidia_smi():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        p = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return {"path": smi, "code": -1, "message": str(e), "gpus": []}
    lines = (p.stdout + p.stderr).strip().splitlines()
    return {"path": smi, "code": p.returncode, "message": lines[-1] if lines else "",
            "gpus": [ln for ln in p.stdout.splitlines() if ln.startswith("GPU ")], "persistence": persistence(smi)}


def persistence(smi):
    """index -> "Enabled" / "Disabled" / "[N/A]" as nvidia-smi prints it; {} when it cannot say."""
    try:
        p = subprocess.run([smi, "--query-gpu=index,persistence_mode", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    for line in p.stdout.splitlines() if p.returncode == 0 else []:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            out[parts[0]] = parts[1]
    return out


def py_spy():
    """py-spy (what `dflashctl stacks` uses): on PATH or beside this interpreter, and its version."""
    exe = shutil.which("py-spy")
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if exe is None and os.path.isfile(beside) and os.access(beside, os.X_OK):
        exe = beside
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return {"path": exe, "version": None, "error": str(e)}
    return {"path": exe, "version": p.stdout.strip() or None, "error": None if p.returncode == 0 else
            (p.stderr.strip().splitlines() or ["exit " + str(p.returncode)])[-1]}


def workspace_writable(ws):
    try:
        os.makedirs(ws, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=ws, prefix=".dflashctl-check-")
        os.write(fd, b"ok")
        os.close(fd)
        os.unlink(tmp)
        return {"writable": True}
    except OSError as e:
        return {"writable": False, "error": str(e.strerror or e) + ": " + str(e.filename or ws)}


def disk(ws):
    path = ws
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        u = shutil.disk_usage(path)
    except OSError as e:
        return {"error": str(e)}
    return {"free_bytes": u.free, "total_bytes": u.total, "path": path}


def main(argv):
    ws = argv[0]
    return reply({"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable,
                  "nvidia_smi": nvidia_smi(), "workspace": workspace_writable(ws), "disk": disk(ws),
                  "py_spy": py_spy()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
