"""/proc readers and the run marker: what names a process as part of a run (stdlib only)."""

from __future__ import annotations

import os

from dflashctl.agent.lib.fsutil import read_bytes

MARKER = "DFLASH_RUN_ID"  # in the environment of every process of a run we started: the run's id
RUN_DIR_VAR = "DFLASH_RUN_DIR"  # beside it: the run's directory (a run of the same id elsewhere is not ours)
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_stat(pid: int) -> dict | None:
    """state, ppid, pgid and start time (clock ticks since boot) from /proc/PID/stat."""
    data = read_bytes(f"/proc/{pid}/stat", 4096)
    if not data:
        return None
    text = data.decode("utf-8", "replace")
    rest = text[text.rfind(")") + 2:].split()  # the comm field may contain spaces and parens
    try:
        return {"state": rest[0], "ppid": int(rest[1]), "pgid": int(rest[2]), "starttime": int(rest[19])}
    except (IndexError, ValueError):
        return None


def proc_marker(pid: int) -> str | None:
    """DFLASH_RUN_ID from the process's environment (set at exec time, so it cannot drift)."""
    return proc_env_var(pid, MARKER)


def proc_env_var(pid: int, name: str) -> str | None:
    """One variable of the process's environment as it was exec'd (/proc/PID/environ)."""
    data = read_bytes(f"/proc/{pid}/environ", 1 << 18)
    if not data:
        return None
    for item in data.split(b"\0"):
        if item.startswith(name.encode() + b"="):
            return item[len(name) + 1:].decode("utf-8", "replace")
    return None


def proc_cmdline(pid: int, limit: int = 400) -> str:
    data = read_bytes(f"/proc/{pid}/cmdline", 8192) or b""
    return data.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:limit]


def proc_argv(pid: int) -> list | None:
    """The process's argv, byte-exact (undecodable bytes kept as surrogates); None when it is gone."""
    data = read_bytes(f"/proc/{pid}/cmdline", 1 << 20)
    if data is None:
        return None
    parts = data.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return [a.decode("utf-8", "surrogateescape") for a in parts]


def process_identity(pid: int) -> dict | None:
    """What names one process across pid reuse: pid, start time (clock ticks since boot, /proc/PID/stat
    field 22), the boot time and the argv. None when the pid is gone or defunct."""
    st = proc_stat(pid)
    if st is None or st["state"] in ("Z", "X"):
        return None
    btime = boot_time()
    return {"pid": pid, "starttime": st["starttime"], "boot_time": btime, "clk_tck": _CLK_TCK,
            "start_epoch": btime + st["starttime"] / float(_CLK_TCK), "cmdline": proc_argv(pid) or [],
            "pgid": st["pgid"]}


def is_process(identity: dict | None) -> bool:
    """identity (process_identity's record, e.g. an adopted run's) still names a live process: the same
    start time (a reused pid has another), boot and argv. The check made before every signal to it."""
    try:
        pid, start = int(identity["pid"]), int(identity["starttime"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return False
    st = proc_stat(pid)
    if st is None or st["state"] in ("Z", "X") or st["starttime"] != start:
        return False
    recorded, now = identity.get("boot_time"), boot_time()  # type: ignore[union-attr]
    if recorded and now and abs(float(recorded) - now) > 1.0:
        return False
    argv = identity.get("cmdline")  # type: ignore[union-attr]
    return argv is None or proc_argv(pid) == list(argv)


def boot_time() -> float:
    for line in (read_bytes("/proc/stat", 1 << 16) or b"").decode().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def proc_age_s(starttime_ticks: int, now: float, btime: float) -> float:
    return max(0.0, now - (btime + starttime_ticks / float(_CLK_TCK)))


def run_alive(pid: int | None, run_id: str) -> bool:
    """The recorded pid is alive AND still ours: not defunct, and carries this run's marker
    (a reused pid carries some other environment)."""
    if not pid:
        return False
    st = proc_stat(pid)
    if st is None or st["state"] in ("Z", "X"):
        return False
    return proc_marker(pid) == run_id


def live_groups() -> dict:
    """pgid -> pids of the live (not defunct) processes in it: one pass over /proc/*/stat."""
    groups: dict = {}
    for name in _listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st["state"] not in ("Z", "X"):
                groups.setdefault(st["pgid"], []).append(int(name))
    return groups


def group_alive(pgid: int | None, run_id: str, cache: dict | None = None) -> bool:
    """Some live process of process group pgid carries this run's marker: what the trainer left
    behind while its supervisor reaps the group. cache: share one /proc pass among many runs
    (`runs` lists them all); the markers are read only for members of the group."""
    if not pgid:
        return False
    cache = {} if cache is None else cache
    if "groups" not in cache:
        cache["groups"] = live_groups()
    return any(proc_marker(pid) == run_id for pid in cache["groups"].get(pgid, ()))


def group_live(pgid: int) -> bool:
    """Some process of group pgid is alive (defunct members count as gone)."""
    for name in _listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st["pgid"] == pgid and st["state"] not in ("Z", "X"):
                return True
    return False


def marked_processes(run_id: str, run_dir: str, exclude: tuple = ()) -> dict:
    """pid -> start time of every live process carrying this run's marker AND its DFLASH_RUN_DIR (a run of the
    same id in another workspace is not ours), but those in exclude."""
    found = {}
    for name in _listdir("/proc"):
        if name.isdigit() and int(name) not in exclude:
            st = proc_stat(int(name))
            if st is not None and st["state"] not in ("Z", "X") and proc_marker(int(name)) == run_id \
                    and proc_env_var(int(name), RUN_DIR_VAR) == run_dir:
                found[int(name)] = st["starttime"]
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def process_table() -> dict:
    """pid -> proc_stat of every process (defunct ones included): one pass over /proc."""
    table = {}
    for name in _listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                table[int(name)] = st
    return table


def descendants(roots, table: dict) -> set:
    """Every live process below roots by parent links (ppid), roots excluded. A child whose parent died was
    reparented (to init or a subreaper) and is not found this way: the run's marker, or a recorded identity, is."""
    children: dict = {}
    for pid, st in table.items():
        children.setdefault(st["ppid"], []).append(pid)
    found: set = set()
    todo = [r for r in roots if r]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and child not in roots:
                found.add(child)
                todo.append(child)
    return {p for p in found if table[p]["state"] not in ("Z", "X")}


def ancestors(pid: int, table: dict) -> set:
    """pid and every process above it (the caller's own shell, `pct exec`, sshd): never part of a run's tree."""
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        pid = (table.get(pid) or proc_stat(pid) or {"ppid": 0})["ppid"]
    return out


def run_tree(run_id: str, run_dir: str, roots, recorded=(), exclude=(), table: dict | None = None) -> dict:
    """pid -> start time of every live process of one run's tree, found again now (DESIGN §4, issue 24): the roots
    (a launched run's trainer, an adopted run's process: checked by the caller, a dead root's pid may be reused)
    and recorded members (adopt's record of the tree: {pid,
    starttime}) that are still the same process, everything below them by parent links, and every process carrying
    the run's marker AND its run directory (what double-forked or setsid out of the group and was reparented).
    exclude: processes never counted (the supervisor and its sentinel, the caller and its ancestors)."""
    table = process_table() if table is None else table
    skip = set(exclude)

    def live(pid: int) -> bool:
        st = table.get(pid)
        return st is not None and st["state"] not in ("Z", "X") and pid not in skip

    found = {}
    for rec in recorded:
        try:
            pid, start = int(rec["pid"]), int(rec["starttime"])
        except (KeyError, TypeError, ValueError):
            continue
        if live(pid) and table[pid]["starttime"] == start:
            found[pid] = start
    for pid in roots:
        if pid and live(pid):
            found[pid] = table[pid]["starttime"]
    for pid in descendants(list(found), table):
        if live(pid):
            found[pid] = table[pid]["starttime"]
    if run_id:
        for pid, st in table.items():
            if pid not in found and live(pid) and proc_marker(pid) == run_id \
                    and proc_env_var(pid, RUN_DIR_VAR) == run_dir:
                found[pid] = st["starttime"]
    return found


def same_process(pid: int, starttime: int) -> bool:
    """pid still names the live process that started at starttime (the check before every signal)."""
    st = proc_stat(pid)
    return st is not None and st["state"] not in ("Z", "X") and st["starttime"] == starttime
