"""`hosts check`, the container side: the python, nvidia-smi, whether the workspace is writable, free disk, py-spy
(and whether it can attach: ptrace may be denied in a container), the /dev/nvidia* nodes (numbers, and whether the
device cgroup lets them open) and the user-space driver version (to hold against the host's kernel module).

One report (lib/frame.py) judged on the laptop by dflashctl/commands/hosts.py. Runs under any Python 3 (no
f-strings, no annotations): its job is to report an interpreter too old for the rest, not to fail on one.
Argument: the workspace.
"""

import errno
import glob
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

from dflashctl.agent.lib.frame import reply


def run_tool(*argv, timeout=60):
    """argv's CompletedProcess (text), or the message of why it could not run at all."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)


def nvidia_smi():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    p = run_tool(smi, "-L")
    if isinstance(p, str):
        return {"path": smi, "code": -1, "message": p, "gpus": []}
    lines = (p.stdout + p.stderr).strip().splitlines()
    return {"path": smi, "code": p.returncode, "message": lines[-1] if lines else "",
            "gpus": [ln for ln in p.stdout.splitlines() if ln.startswith("GPU ")], "persistence": persistence(smi)}


def persistence(smi):
    """index -> "Enabled" / "Disabled" / "[N/A]" as nvidia-smi prints it; {} when it cannot say."""
    p = run_tool(smi, "--query-gpu=index,persistence_mode", "--format=csv,noheader")
    if isinstance(p, str):
        return {}
    out = {}
    for line in p.stdout.splitlines() if p.returncode == 0 else []:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            out[parts[0]] = parts[1]
    return out


def nvidia_nodes():
    """The /dev/nvidia* nodes: path, char or not, major:minor, and why opening it fails (None: it opens). In a
    container a node the device cgroup does not allow exists but fails with EPERM."""
    out = []
    for path in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        node = {"path": path, "char": stat.S_ISCHR(st.st_mode), "major": os.major(st.st_rdev),
                "minor": os.minor(st.st_rdev), "open_error": None}
        try:
            os.close(os.open(path, os.O_RDWR | getattr(os, "O_NONBLOCK", 0)))
        except OSError as e:
            node["open_error"] = (errno.errorcode.get(e.errno, str(e.errno)), e.strerror)
        out.append(node)
    return out


VERSION_LINE = re.compile(r"^(NVIDIA-SMI|NVML|DRIVER) version\s*:\s*(\S+)", re.M)
NVML_LIBRARY = re.compile(r"NVML library version:\s*(\S+)")


def driver_user():
    """The container's user-space driver: `nvidia-smi --version` (NVIDIA-SMI / NVML / DRIVER lines), or on a
    mismatch with the kernel module its "NVML library version: X" line; and the libnvidia-ml.so.<version> files."""
    libs = sorted({os.path.basename(p)[len("libnvidia-ml.so."):] for d in LIB_DIRS
                   for p in glob.glob(os.path.join(d, "libnvidia-ml.so.*.*"))})
    doc = {"smi": None, "nvml": None, "driver": None, "mismatch": False, "message": None, "libs": libs}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return doc
    p = run_tool(smi, "--version")
    if isinstance(p, str):
        doc["message"] = p
        return doc
    text = p.stdout + p.stderr
    for key, value in VERSION_LINE.findall(text):
        doc[{"NVIDIA-SMI": "smi", "NVML": "nvml", "DRIVER": "driver"}[key]] = value
    m = NVML_LIBRARY.search(text)
    if m:
        doc["nvml"] = m.group(1)
    doc["mismatch"] = "version mismatch" in text
    if p.returncode != 0:
        doc["message"] = (text.strip().splitlines() or ["exit " + str(p.returncode)])[0]
    return doc


LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def py_spy_attach(exe):
    """Can py-spy read a live Python process here? A child interpreter that waits, `py-spy dump` of it: a
    container whose seccomp / AppArmor / capabilities deny ptrace shows up here, not in `py-spy --version`."""
    child = None
    try:
        child = subprocess.Popen([sys.executable, "-c", "import sys; print(1, flush=True); sys.stdin.read()"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        child.stdout.readline()  # it runs Python code now
        p = subprocess.run([exe, "dump", "--pid", str(child.pid)], capture_output=True, text=True, timeout=30)
        if p.returncode == 0:
            return {"ok": True, "error": None}
        lines = [ln.strip() for ln in (p.stderr + p.stdout).strip().splitlines() if ln.strip()]
        return {"ok": False, "error": "; ".join(lines[-3:]) or "exit " + str(p.returncode)}
    except (OSError, subprocess.SubprocessError) as e:
        return {"ok": False, "error": str(e)}
    finally:
        if child is not None:
            child.kill()
            child.wait()


def py_spy():
    """py-spy (what `dflashctl stacks` uses): on PATH or beside this interpreter, and its version."""
    exe = shutil.which("py-spy")
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if exe is None and os.path.isfile(beside) and os.access(beside, os.X_OK):
        exe = beside
    if exe is None:
        return None
    p = run_tool(exe, "--version", timeout=10)
    if isinstance(p, str):
        return {"path": exe, "version": None, "error": p}
    doc = {"path": exe, "version": p.stdout.strip() or None, "error": None if p.returncode == 0 else
           (p.stderr.strip().splitlines() or ["exit " + str(p.returncode)])[-1]}
    if doc["error"] is None:
        doc["attach"] = py_spy_attach(exe)
    return doc


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
                  "py_spy": py_spy(), "nvidia_nodes": nvidia_nodes(), "driver": driver_user()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
