"""Exit codes say where a command failed: a remote step that ran and failed is 106, never the usage code 2.

The AST check keeps it so: every `DflashError(...)` raised in dflashctl names its exit code, or a subclass (which
carries one) is raised instead, so no new failure falls back to 2 by default.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.errors import ConfigError, ConnectFailed, DflashError, ExitCode, RemoteFailed, RemoteTimeout
from dflashctl.model import Host
from dflashctl.remote import connect
from dflashctl.report import check_version

REPO = Path(__file__).resolve().parent.parent


def bare_raises(root: Path) -> list[str]:
    """file:line of every `DflashError(...)` call without exit_code= under root."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "DflashError" \
                    and not any(k.arg == "exit_code" for k in node.keywords):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_every_dflash_error_raised_names_its_exit_code() -> None:
    assert bare_raises(REPO / "dflashctl") == []


def test_the_bare_raise_check_finds_one(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("raise DflashError('x')\nraise DflashError('y', exit_code=3)\n")
    assert bare_raises(tmp_path / "pkg") == ["pkg/m.py:1"]


def test_exit_codes_are_distinct_per_kind_of_failure() -> None:
    codes = {ConfigError: 2, RemoteTimeout: 101, ConnectFailed: 102, RemoteFailed: 106}
    assert {cls: int(cls("x").exit_code) for cls in codes} == codes
    assert len(set(ExitCode)) == len({int(c) for c in ExitCode})


def test_a_probe_reply_of_another_version_is_a_remote_failure() -> None:
    with pytest.raises(RemoteFailed, match="probe version 0 does not match") as exc:
        check_version({"probe_version": 0})
    assert exc.value.exit_code == 106


def test_usage_md_documents_every_exit_code() -> None:
    table = (REPO / "docs" / "usage.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(line.split("|")[1]) for line in table.splitlines() if line.startswith("| 1") or line.startswith("| 0")
            or line.startswith("| 2")}
    assert {int(c) for c in ExitCode} <= rows


def test_the_cli_prints_a_remote_failure_in_one_line_with_its_code(tmp_path: Path) -> None:
    """The CLI boundary turns RemoteFailed into ERROR: one line, exit 106 (no traceback)."""
    code = ("import sys\nfrom dflashctl.cli import main\nfrom dflashctl.cli.app import app\n"
            "from dflashctl.errors import RemoteFailed\n"
            "@app.command('boom-remote')\ndef boom():\n    raise RemoteFailed('writing /x on pve1 failed (exit 1): "
            "No space left on device')\nsys.exit(main(['boom-remote']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 106, done.stderr
    assert "Traceback" not in done.stderr
    assert "ERROR: writing /x on pve1 failed (exit 1): No space left on device" in done.stderr
    assert isinstance(RemoteFailed("x"), DflashError)


def test_a_probe_that_prints_no_report_is_a_remote_failure(tmp_path: Path) -> None:
    """A real local target whose python runs and says nothing (`true`): the host was reached, the step failed."""
    from dflashctl.remote import probe

    with connect(Host("local", python="true", workspace=str(tmp_path))) as target, pytest.raises(RemoteFailed) as exc:
        probe.probe_once(target, str(tmp_path), "latest", gpus=False, require_run=False)
    assert exc.value.exit_code == 106 and "probe on local printed no report (exit 0)" in exc.value.message
