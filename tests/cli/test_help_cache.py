"""`--help` from the help cache (dflashctl/helpcache.py): byte for byte what typer prints, without importing typer on
a hit; a different terminal, environment or code is a miss; a failing command line is never stored."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl import helpcache

# runs the console script's main as the installed `dflashctl` does; the modules it held go to stderr as JSON
_ENTRY = ("import json, sys\nsys.argv = ['dflashctl', *sys.argv[1:]]\nfrom dflashctl.entry import main\n"
          "rc = main()\nsys.stdout.flush()\n"
          "sys.stderr.write('\\nMODULES ' + json.dumps({'rc': rc, 'modules': sorted(sys.modules)}) + '\\n')\n")


def entry(cache: Path, *argv: str, **env: str) -> tuple[int, bytes, bool]:
    """Exit code, stdout bytes, and whether typer was imported, for one new `dflashctl` process."""
    full = {k: v for k, v in os.environ.items() if k != "DFLASHCTL_NO_HELP_CACHE"}
    full.update(XDG_CACHE_HOME=str(cache), **env)
    p = subprocess.run([sys.executable, "-c", _ENTRY, *argv], capture_output=True, timeout=120, env=full)
    line = next(ln for ln in p.stderr.decode().splitlines() if ln.startswith("MODULES "))
    doc = json.loads(line.removeprefix("MODULES "))
    return doc["rc"], p.stdout, "typer" in doc["modules"]


def entries(cache: Path) -> list[Path]:
    folder = cache / "dflashctl" / "help"
    return sorted(folder.glob("*.txt")) if folder.exists() else []


@pytest.mark.parametrize("argv", [["--help"], ["status", "--help"], ["hosts", "check", "-h"]])
def test_a_second_help_prints_typers_bytes_without_importing_typer(tmp_path: Path, argv: list[str]) -> None:
    rc0, typer_text, _ = entry(tmp_path, *argv, DFLASHCTL_NO_HELP_CACHE="1")
    rc1, first, typer1 = entry(tmp_path, *argv)
    rc2, second, typer2 = entry(tmp_path, *argv)
    assert (rc0, rc1, rc2) == (0, 0, 0)
    assert b"Usage" in typer_text
    assert first == typer_text and second == typer_text
    assert (typer1, typer2) == (True, False)
    assert len(entries(tmp_path)) == 1


def test_the_cache_folder_is_private_to_the_user(tmp_path: Path) -> None:
    entry(tmp_path, "--help")
    folder = tmp_path / "dflashctl" / "help"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_different_rendering_environment_is_a_miss_and_renders_afresh(tmp_path: Path) -> None:
    _, plain, _ = entry(tmp_path, "--help")
    rc, forced, typer_loaded = entry(tmp_path, "--help", FORCE_COLOR="1")
    assert (rc, typer_loaded) == (0, True)
    assert b"\x1b[" in forced and b"\x1b[" not in plain  # colour was rendered, not the plain entry replayed
    assert len(entries(tmp_path)) == 2
    _, again, typer_loaded = entry(tmp_path, "--help", FORCE_COLOR="1")
    assert (again, typer_loaded) == (forced, False)


def test_a_command_line_that_fails_is_never_stored(tmp_path: Path) -> None:
    rc, _, _ = entry(tmp_path, "no-such-verb", "--help")
    assert rc != 0
    assert entries(tmp_path) == []
    rc, _, typer_loaded = entry(tmp_path, "no-such-verb", "--help")
    assert (rc != 0, typer_loaded) == (True, True)


def test_a_changed_or_added_module_changes_the_code_fingerprint(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    shutil.copytree(Path(helpcache.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = helpcache.code_fingerprint([pkg])
    assert helpcache.code_fingerprint([pkg]) == before
    target = pkg / "cli" / "status.py"
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    touched = helpcache.code_fingerprint([pkg])
    (pkg / "cli" / "new_module.py").write_text("")
    added = helpcache.code_fingerprint([pkg])
    assert len({before, touched, added}) == 3


def test_entries_of_an_older_code_version_are_removed_when_a_new_one_is_stored(tmp_path: Path) -> None:
    folder = tmp_path / "dflashctl" / "help"
    folder.mkdir(parents=True, mode=0o700)
    stale = folder / "000000000000000000000000-111111111111111111111111.txt"
    stale.write_bytes(b"old help\n")
    rc, out, _ = entry(tmp_path, "--help")
    assert rc == 0 and out != b"old help\n"
    assert not stale.exists() and len(entries(tmp_path)) == 1


@pytest.mark.parametrize(("argv", "wanted"), [
    (["--help"], True), (["-h"], True), (["status", "--help"], True), (["hosts", "check", "--help"], True),
    ([], False), (["version"], False), (["status"], False), (["--help", "status"], False),
    (["status", "--host", "pve1", "--help"], False), (["logs", "RUN", "--help"], False),
])
def test_only_plain_command_words_then_a_help_flag_are_answered_from_the_cache(argv: list[str], wanted: bool) -> None:
    assert helpcache.help_request(argv) is wanted


def test_without_an_absolute_home_nothing_is_cached_under_the_working_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DFLASHCTL_NO_HELP_CACHE", "XDG_CACHE_HOME")}
    env["HOME"] = "relative-home"
    p = subprocess.run([sys.executable, "-c", _ENTRY, "--help"], capture_output=True, timeout=120, env=env,
                       cwd=tmp_path)
    assert p.returncode == 0 and b"Usage" in p.stdout
    assert list(tmp_path.iterdir()) == []
