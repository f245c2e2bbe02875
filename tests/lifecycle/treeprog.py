"""A training program with a process tree, for the `stop` / `adopt` / `kill-zombies` tests of issue 24.

TREE_PROG logs `step=N loss=…` lines and, steered by its arguments: `--worker` starts a DataLoader-like child (same
process group, stdin/stdout inherited, it just waits); `--escape` starts a child that leaves the group (setsid) and
the tree (its shell exits at once: reparented to init), as a program that double-forks does; `--ignore-term`
ignores SIGTERM (only SIGKILL ends it). It records its own pid and its children's in `tree.json` in its control
directory ($DFLASH_RUN_DIR when dflashctl launched it, else its working directory), and ends when `finish` appears
there. With `--half-write` it first leaves in its TORCHINDUCTOR_CACHE_DIR what a compile killed mid-write leaves in
a compile cache (an inductor `.PID.TID.tmp` named after itself, a 0-byte `.so`) and a whole ELF copied from this
machine.
"""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import wait_until

TREE_PROG = r'''
import json, os, shutil, signal, subprocess, sys, sysconfig, threading, time

ctl = os.environ.get("DFLASH_RUN_DIR") or os.getcwd()
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
kids = {}
if "--worker" in sys.argv:
    kids["worker"] = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.2)"]).pid
if "--escape" in sys.argv:
    out = os.path.join(ctl, "escaped.pid")
    subprocess.run(["setsid", "sh", "-c", '"$0" -c "import time; time.sleep(600)" </dev/null >/dev/null 2>&1 & '
                    'echo $! > "$1"', sys.executable, out], check=True)
    kids["escaped"] = int(open(out).read())
if "--half-write" in sys.argv:
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    os.makedirs(cache, exist_ok=True)
    open(os.path.join(cache, f".{os.getpid()}.{threading.get_ident()}.tmp"), "wb").write(b"partial")
    open(os.path.join(cache, "cabc123.main.so"), "wb").close()
    lib = sysconfig.get_config_var("DESTSHARED")
    whole = os.path.join(lib, sorted(n for n in os.listdir(lib) if n.endswith(".so"))[0])
    shutil.copy(whole, os.path.join(cache, "cdone456.main.so"))
with open(os.path.join(ctl, "tree.json.tmp"), "w") as f:
    json.dump({"pid": os.getpid(), "pgid": os.getpgid(0), "kids": kids, "env": dict(os.environ)}, f)
os.replace(os.path.join(ctl, "tree.json.tmp"), os.path.join(ctl, "tree.json"))
step = 0
while not os.path.exists(os.path.join(ctl, "finish")):
    step += 1
    try:
        print(f"step={step} loss={5.0 / step:.4f}", flush=True)
    except OSError:  # a full disk under the log: training goes on (the disk-full tests)
        pass
    time.sleep(0.1)
print("tree prog: finished", flush=True)
'''


def write_tree_prog(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "treeprog.py").write_text(TREE_PROG)
    return directory


def tree_of(ctl: Path, timeout: float = 60) -> dict:
    """The program's tree.json, once it has written it."""
    path = ctl / "tree.json"
    return wait_until(lambda: path.exists() and json.loads(path.read_text()), timeout=timeout, what=str(path))


def all_gone(box, pids) -> bool:  # noqa: ANN001 - userprog.Box
    return not any(box.alive(p) for p in pids)


def settle(box, pids, timeout: float = 30) -> None:  # noqa: ANN001
    """Wait until none of pids is alive (a process signalled a moment ago may still be exiting)."""
    wait_until(lambda: all_gone(box, pids), timeout=timeout, what=f"processes {sorted(pids)} to be gone")
