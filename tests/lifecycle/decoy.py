"""Decoy processes for the kill-zombies safety tests, started detached (double fork, new session)
so that no test process is their parent: `DECOY_PIDFILE=F python decoy.py MODE` (the pid file
travels in the environment so a leftover and its look-alike have the very same command line).

MODE sleeper: sleeps (a leftover of an earlier run when started with DFLASH_RUN_ID set; a
look-alike when started without). MODE defunct-parent: forks a child that exits at once and is
never reaped (a defunct child), then sleeps. The pid file gets "PID [CHILD_PID]" once all is in place.
"""

import os
import sys
import time


def main() -> None:
    mode, pidfile = sys.argv[1], os.environ["DECOY_PIDFILE"]
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    pids = [os.getpid()]
    if mode == "defunct-parent":
        child = os.fork()
        if child == 0:
            os._exit(0)
        pids.append(child)
        while True:  # wait until the child really is defunct before saying we are ready
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(" ".join(map(str, pids)))
    os.replace(tmp, pidfile)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
