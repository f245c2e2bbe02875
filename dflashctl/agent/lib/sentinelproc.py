"""The run's sentinel as its supervisor sees it: started beside the program, told the exit code, given a moment to
finish (stdlib only). The sentinel itself is sentinel/main.py, run from the run's copy of the agent archive:
`python3 <run>/agent.pyz sentinel <run>` (the name process listings recognise it by)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from urllib.parse import urlsplit

SENTINEL_END_S = 8.0  # the sentinel's last events, notifications and restart decision (sentinel/main.py END_WAIT_S)
REACH_TIMEOUT_S = 3.0
AGENT_FILE = "agent.pyz"  # the run's copy of the agent archive: its supervisor and sentinel run from it


def unreachable(targets: list) -> str | None:
    """Why a notify URL cannot be reached from here (the container sends them), or None: a TCP connect to each,
    before anything is created."""
    for t in targets:
        url = t.get("url")
        if not url:
            continue
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
        except OSError as e:
            return f"notify target {t.get('kind')} {parts.scheme}://{host}:{port} is unreachable from the " \
                   f"container: {e.strerror or e}"
    return None


def is_sentinel(argv: list) -> bool:
    """Whether a process's argv is a run's sentinel (`python3 <run>/agent.pyz sentinel <run>`, or for a run started
    by a CLI before the agent archive, `python3 <run>/sentinel.pyz <run>`: such a run may still be going)."""
    return any(str(a).endswith(AGENT_FILE) and argv[i + 1:i + 2] == ["sentinel"] or str(a).endswith("/sentinel.pyz")
               for i, a in enumerate(argv))


def start_sentinel(run_dir: str, watched: bool, say) -> subprocess.Popen | None:  # noqa: ANN001 - say: a log line
    """The run's sentinel (when the launch asked for one: watched): our child, in our session, with the run's
    marker (kill-zombies sees it as part of the run); its stdin is how it learns the exit code; its output goes to
    sentinel.log, never into train.log (which it reads)."""
    pyz = os.path.join(run_dir, AGENT_FILE)
    if not watched or not os.path.exists(pyz):
        return None
    try:
        with open(os.path.join(run_dir, "sentinel.log"), "ab") as out:
            return subprocess.Popen([sys.executable, pyz, "sentinel", run_dir], stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=run_dir)
    except OSError as e:
        say(f"could not start the run's sentinel: {e} (the run goes on unwatched)")
        return None


def end_sentinel(sentinel: subprocess.Popen | None, code: int, say) -> None:  # noqa: ANN001
    """Tell the sentinel the exit code and give it SENTINEL_END_S for its last events, notifications and restart
    decision; then it is ended, so that `exit_code` still means nothing of the run is left."""
    if sentinel is None:
        return
    with contextlib.suppress(OSError, ValueError):
        sentinel.stdin.write(f"{code}\n".encode())
        sentinel.stdin.close()
    try:
        sentinel.wait(SENTINEL_END_S)
    except subprocess.TimeoutExpired:
        sentinel.kill()
        sentinel.wait()
        say(f"the sentinel did not finish within {SENTINEL_END_S:g} s of the end; ended it")
