"""PID 1 of a test "container" (tests/harness/bin/pct): reaps orphans like LXC's init, never exits.

Run as `python3 -S ctinit.py READY_FILE` inside the new PID + mount namespace, after /workspace is
bound. It writes READY_FILE so `pct start` returns only once the container can take commands.
Killing it (SIGKILL from the host, as `pct stop` does) ends every process in the namespace.
"""

import os
import signal
import sys
import time


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with open(sys.argv[1], "w") as f:
        f.write(str(os.getpid()))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.1)
        except InterruptedError:
            pass


if __name__ == "__main__":
    main()
