"""`gpus --watch`: the live screen driven in a real terminal (tmux: keys sent, the screen captured), and the plain
rows it degrades to when stdout is a pipe. The CLI runs as its own process, as a user starts it."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.poll import wait_until

from .scene import CUR, OLD

DFLASHCTL = Path(sys.executable).parent / "dflashctl"


def _env(pve) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # the terminal's size decides
    return {**env, **pve.env, "DFLASHCTL_NO_SERVER": "1"}


class Tmux:
    """One private tmux server (its own socket) running one command in a 150x50 pane that stays after it exits."""

    def __init__(self, tmp: Path, argv: list[str], env: dict[str, str]):
        self.sock = str(tmp / "tmux.sock")
        conf = tmp / "tmux.conf"
        conf.write_text("set -g remain-on-exit on\nset -g default-size 150x50\n")
        script = tmp / "run.sh"
        script.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()
                                  if k.isidentifier()) + "export TERM=xterm-256color\n"
                          # the pane's size decides (tmux's server may pass on its starter's COLUMNS/LINES)
                          "unset COLUMNS LINES\nexec " + shlex.join(argv) + "\n")
        self.tmux("-f", str(conf), "new-session", "-d", "-s", "g", "-x", "150", "-y", "50", f"sh {script}")

    def tmux(self, *args: str) -> str:
        res = subprocess.run(["tmux", "-S", self.sock, *args], capture_output=True, timeout=30)
        assert res.returncode == 0, res.stderr.decode()
        return res.stdout.decode()

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "g")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "g", *keys)

    def dead(self) -> tuple[bool, str]:
        dead, _, status = self.tmux("display-message", "-p", "-t", "g", "#{pane_dead} #{pane_dead_status}") \
            .strip().partition(" ")
        return dead == "1", status

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True, timeout=30)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_live_view_in_a_terminal_selects_sorts_and_quits(scene, tmp_path):
    p = scene.procs
    tmux = Tmux(tmp_path, [str(DFLASHCTL), "gpus", "--watch", "--interval", "0.5"], _env(scene.pve))
    try:
        def shows(*texts: str):
            return lambda: (lambda s: s if all(t in s for t in texts) else None)(tmux.screen())

        try:
            first = wait_until(shows("GPU 3", "selected: pid"), 60, "the live view's first reading")
        except AssertionError as e:
            size = tmux.tmux("display-message", "-p", "-t", "g", "#{window_width}x#{window_height}")
            raise AssertionError(f"{e}; the {size.strip()} screen:\n{tmux.screen()}") from None
        assert f"selected: pid {p['current'].host_pid}" in first and f"current {CUR}" in first
        assert "MEM  █" in first and "UTIL █" in first  # bars
        # the second reading adds to each GPU's sparkline
        wait_until(lambda: "▇▇" in tmux.screen(), 30, "a sparkline of two readings")
        tmux.keys("j", "j")  # GPU 0's two processes, then GPU 1's zombie
        screen = wait_until(shows(f"selected: pid {p['zombie'].host_pid}"), 30, "the zombie selected")
        assert "what to do: a zombie of an earlier run: `dflashctl kill-zombies`" in screen
        assert f"earlier {OLD} (zombie)" in screen
        tmux.keys("Down")  # GPU 2's largest holder: another container's run
        screen = wait_until(shows(f"selected: pid {p['theirs'].host_pid}"), 30, "the other container's process")
        assert f"what to do: not ours: ask the owner of container {scene.other.ctid}" in screen
        tmux.keys("s")
        screen = wait_until(shows("order: pid"), 30, "the order changed")
        out = os.environ.get("GPUS_SCREEN_OUT")
        if out:  # docs/gpus-screen.txt is made this way
            Path(out).write_text("\n".join(line.rstrip() for line in screen.splitlines()).rstrip() + "\n")
        tmux.keys("q")
        # tmux marks the pane dead when its pty closes, and fills the status once it reaped the process: wait for both
        dead, status = wait_until(lambda: (lambda d: d if d[0] and d[1] else None)(tmux.dead()), 30,
                                  "the view to end on q")
        assert status == "0"
    finally:
        tmux.close()


def test_watch_piped_prints_plain_rows_per_reading(scene):
    p = scene.procs
    res = subprocess.run([str(DFLASHCTL), "gpus", "--watch", "--interval", "0.3", "--count", "2"],
                         capture_output=True, env=_env(scene.pve), timeout=120)
    out = res.stdout.decode()
    assert res.returncode == 0, res.stderr.decode()
    assert "\x1b[" not in out  # no colour, no cursor movement: rows a pipe can keep
    rows = out.splitlines()
    assert sum(" gpu 1 " in r for r in rows) == 2  # one block per reading
    zombie = [r for r in rows if f"pid {p['zombie'].host_pid} ct {scene.pve.ctid} pid {p['zombie'].ns_pid}" in r]
    assert len(zombie) == 2 and all(f"run earlier {OLD} (zombie)" in r for r in zombie)
    assert any(" gpu 1 " in r and "orphaned" in r for r in rows)
