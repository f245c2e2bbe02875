"""The watch probe's CPU share, and the "before" tree the status benchmarks compare against.

before_tree: a temporary `git worktree` at the commit before the probe's log wait (agent/probe/logwait.py), so the
old behaviour is measured in the same run on the same machine, with no switch kept in the product for it.
probe_cpu: the streaming probe as `status --watch -i 1` runs it (ssh + pct exec, script on stdin, the same
arguments), its utime+stime from /proc/PID/stat over a window, as a share of one core.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loopback import ROOT, PveEnv, SshdServer, start_in_container, wait_for

__all__ = ["before_tree", "probe_cpu", "probe_script"]


@contextmanager
def before_tree(rev: str | None = None) -> Iterator[tuple[Path, str]]:
    """(worktree, short sha) at `rev`; default: the parent of the commit that added agent/probe/logwait.py."""
    if rev is None:
        added = subprocess.run(["git", "log", "--format=%H", "--diff-filter=A", "--",
                                "dflashctl/agent/probe/logwait.py"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
        rev = f"{added[-1]}~1"
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    base = Path(tempfile.mkdtemp(prefix="dflash-before-"))
    tree = base / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, capture_output=True, check=True)
    try:
        yield tree, sha
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


def probe_script(tree: Path, pve: PveEnv | None = None) -> bytes:
    """The probe as `tree`'s CLI runs it, as a program for `python3 -`: a tree that pasted it (remote/scripts.py) sends
    that; a tree with the agent archive (issue 25) gets its archive installed in pve's container (as the CLI would
    on first use) and a two-line program running the probe from it, so both run under the same argv."""
    if not (tree / "dflashctl" / "remote" / "scripts.py").exists():
        from dflashctl.remote import agentcall, agentpack

        assert pve is not None, "the archive is installed in the container: pass pve"
        folder = "/workspace/dflash/.agent"
        done = pve.exec(["python3", "-c", agentcall.installer_source(), folder, agentpack.sha256()],
                        stdin=agentpack.archive(), timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return (f"import sys; sys.path.insert(0, {folder + '/' + agentpack.sha256() + '.pyz'!r})\n"
                "from dflashctl.agent.probe.main import main; sys.exit(main(sys.argv[1:]))\n").encode()
    code = ("import sys; from dflashctl.remote.scripts import module_source; "
            "sys.stdout.write(module_source('probe.main'))")
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                          capture_output=True, check=True).stdout


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _find_probe(run_id: str) -> int | None:
    """The probe's pid as this machine numbers it (the container's PID namespace is a child of ours)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"python3", b"-"] and run_id.encode() in argv and b"--watch" in argv:
            return int(entry)
    return None


def probe_cpu(pve: PveEnv, sshd: SshdServer, script: bytes, run_id: str, step_s: float,
              seconds: float) -> tuple[float, float]:
    """(CPU share of one core, log growth in kB/s) of the watch probe over `seconds`, watching a run that prints a
    progress line every step_s seconds (a large step_s: a quiet run)."""
    run_dir = start_in_container(pve, run_id, step_s=step_s)
    log = run_dir / "train.log"
    wait_for(lambda: b"step=1 " in log.read_bytes(), what="the first step")
    args = ["--workspace", "/workspace/dflash", "--run", run_id, "--log-max", str(1 << 20), "--gpus", "--events",
            "--watch", "--interval", "1"]
    proc = subprocess.Popen(sshd.ssh_argv(f"pct exec {pve.ctid} -- python3 - {' '.join(args)}"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, **sshd.env})
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(script)
    proc.stdin.close()
    try:
        proc.stdout.readline()  # the first report: the probe is up
        wait_for(lambda: _find_probe(run_id), what="the probe's pid")
        pid = _find_probe(run_id)
        assert pid is not None
        t0, c0, s0 = time.monotonic(), _ticks(pid), log.stat().st_size
        while time.monotonic() < t0 + seconds:  # drain its reports as the CLI does
            proc.stdout.readline()
        dt = time.monotonic() - t0
        return (_ticks(pid) - c0) / os.sysconf("SC_CLK_TCK") / dt, (log.stat().st_size - s0) / 1024 / dt
    finally:
        proc.kill()
        proc.wait()
        pve.exec(["sh", "-c", f"kill -9 $(cat /workspace/dflash/runs/{run_id}/pid)"])
