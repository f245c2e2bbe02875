"""Shell completion is typer's: `--show-completion` prints the script for the shell it detects from its parent
processes (shellingham), and the script's completion requests are answered by the console script itself. Run under
bash so that the detected shell does not depend on what runs the tests; no network, no install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DFLASHCTL = Path(sys.executable).parent / "dflashctl"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def under_bash(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """dflashctl ARGS as a child of bash (`; exit $?` keeps bash from exec-ing it: it stays the parent)."""
    script = '"$@"; exit $?'
    return subprocess.run(["bash", "-c", script, "bash", str(DFLASHCTL), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SHELL": "/bin/bash", "COLUMNS": "200", **(env or {})})


def test_show_completion_bash_prints_the_bash_script() -> None:
    res = under_bash("--show-completion", "bash")
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "complete -o default -F _dflashctl_completion dflashctl" in res.stdout
    assert "_DFLASHCTL_COMPLETE=complete_bash" in res.stdout
    assert "Traceback" not in res.stderr


def test_the_script_s_requests_complete_verbs_and_options() -> None:
    verbs = under_bash(env={"_DFLASHCTL_COMPLETE": "complete_bash", "COMP_WORDS": "dflashctl la", "COMP_CWORD": "1"})
    assert verbs.returncode == 0, verbs.stderr
    assert verbs.stdout.split() == ["launch"]
    opts = under_bash(env={"_DFLASHCTL_COMPLETE": "complete_bash", "COMP_WORDS": "dflashctl launch --wait-f",
                           "COMP_CWORD": "2"})
    assert opts.returncode == 0, opts.stderr
    assert opts.stdout.split() == ["--wait-for"]


def test_help_lists_the_completion_options_and_still_exits_0() -> None:
    res = under_bash("--help")
    assert res.returncode == 0, res.stderr
    assert "--show-completion" in res.stdout and "--install-completion" in res.stdout
    assert "launch" in res.stdout and "kill-zombies" in res.stdout


def test_show_completion_in_process_returns_0(capsys: pytest.CaptureFixture) -> None:
    """main() returns the exit code of typer's completion callbacks (they end with sys.exit) instead of raising."""
    from dflashctl.cli import main

    code = main(["--show-completion"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured  # 1: no shell among this process's parents (typer says so on stderr)
    assert ("_dflashctl_completion" in captured.out) == (code == 0)
