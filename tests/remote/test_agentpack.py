"""The agent archive as built (remote/agentpack.py) and installed (agent/agentinstall.py), in real interpreters: its
contents are what its programs import, each importable from the zip alone; it is the same bytes wherever it is built;
the installed copy carries this interpreter's bytecode and a trailer the bootstrap checks."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dflashctl.agent import agentinstall
from dflashctl.remote import agentcall, agentpack

LAPTOP_ONLY = ("cli", "commands", "remote", "config.py", "entry.py", "hostkeys.py")
# every module of the archive, imported from the zip alone: -I -S (no site-packages, no PYTHONPATH), cwd elsewhere
IMPORT_ALL = """import importlib, sys, zipfile
pyz = sys.argv[1]
sys.path.insert(0, pyz)
names = [n[:-3].replace("/", ".").removesuffix(".__init__") for n in zipfile.ZipFile(pyz).namelist()
         if n.endswith(".py") and n != "__main__.py"]
bad = []
for name in sorted(names):
    try:
        mod = importlib.import_module(name)
    except Exception as e:
        bad.append(f"{name}: {type(e).__name__}: {e}")
        continue
outside = sorted(n for n, m in sys.modules.items() if n.startswith("dflashctl")
                 and not str(getattr(m, "__file__", "")).startswith(pyz))
third = sorted({n.split(".")[0] for n in sys.modules} & {"typer", "rich", "paramiko", "torch", "cryptography"})
print(len(names), bad, outside, third)
"""


def import_all(pyz: Path, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-I", "-S", "-c", IMPORT_ALL, str(pyz)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_every_archived_module_imports_from_the_archive_alone_with_the_standard_library(tmp_path: Path) -> None:
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(agentpack.archive())
    count, rest = import_all(pyz, tmp_path).split(" ", 1)
    assert int(count) == len(agentpack.closure()) and rest == "[] [] []"


def test_an_archive_missing_a_module_its_programs_import_is_caught(tmp_path: Path) -> None:
    """The check above can fail: leave out one module the sentinel's engine imports."""
    names = [n for n in agentpack.closure() if n != "dflashctl.analysis.health"]
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(agentpack.pack(agentpack.files(names)))
    _, rest = import_all(pyz, tmp_path).split(" ", 1)
    assert "dflashctl.sentinel.main: ModuleNotFoundError" in rest and "dflashctl.analysis.health" in rest


def test_the_closure_follows_lazy_and_relative_imports_and_refuses_a_missing_module(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from dflashctl.analysis import health\n    import dflashctl.bounds\n"
                    "from . import errors\n")
    assert agentpack.imports_of(path, "dflashctl.m") >= {"dflashctl.analysis", "dflashctl.analysis.health",
                                                         "dflashctl.bounds", "dflashctl.errors"}
    with pytest.raises(ValueError, match="dflashctl.nothing_here"):
        agentpack.closure(("dflashctl.nothing_here",))


def test_the_archive_holds_the_programs_byte_for_byte_and_nothing_of_the_laptop_side() -> None:
    z = zipfile.ZipFile(io.BytesIO(agentpack.archive()))
    names = z.namelist()
    assert "__main__.py" in names
    for part in LAPTOP_ONLY:
        assert not any(n.startswith(f"dflashctl/{part}") for n in names), part
    for name in ("dflashctl/analysis/health.py", "dflashctl/report.py", "dflashctl/sentinel/main.py",
                 "dflashctl/agent/probe/main.py", "dflashctl/agent/launcher.py", "dflashctl/agent/verbs.py"):
        assert z.read(name) == (agentpack.PACKAGE_DIR.parent / name).read_bytes(), name


def test_the_archive_is_the_same_bytes_when_built_again_in_another_interpreter() -> None:
    code = "import hashlib; from dflashctl.remote.agentpack import build; print(hashlib.sha256(build()).hexdigest())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == agentpack.sha256() == hashlib.sha256(agentpack.archive()).hexdigest()


def test_a_command_reads_the_archive_built_once_and_a_damaged_entry_is_built_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    agentpack.archive.cache_clear()  # (sha256() keeps its value: the same sources give the same bytes)
    try:
        first = agentpack.archive()
        (entry,) = (tmp_path / "dflashctl" / "agentpack").glob("*.pyz")
        assert entry.name == f"{agentpack.signature()}.pyz" and entry.read_bytes()[64:] == first
        assert (entry.parent.stat().st_mode & 0o777) == 0o700
        agentpack.archive.cache_clear()
        entry.write_bytes(entry.read_bytes()[:-10])
        assert agentpack.archive() == first == agentpack.build() and entry.read_bytes()[64:] == first
        assert hashlib.sha256(first).hexdigest() == agentpack.sha256()
    finally:
        agentpack.archive.cache_clear()
        agentpack.sha256.cache_clear()


def install(folder: Path, data: bytes | None = None, sha: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", agentcall.installer_source(), str(folder), sha or agentpack.sha256()],
                          input=agentpack.archive() if data is None else data, capture_output=True, text=False,
                          timeout=120)


def boot(path: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", "-c", agentcall.BOOT, str(path), *args], input=stdin,
                          capture_output=True, timeout=120)


def test_the_installed_archive_carries_this_pythons_bytecode_and_a_trailer_the_bootstrap_checks(tmp_path) -> None:
    folder = tmp_path / "ws" / ".agent"
    done = install(folder)
    assert done.returncode == 0 and done.stdout.startswith(b"DFLASH-AGENT-INSTALL ok"), done.stdout + done.stderr
    path = folder / f"{agentpack.sha256()}.pyz"
    data = path.read_bytes()
    assert data[-77:-64] == agentinstall.TAG and hashlib.sha256(data[:-77]).hexdigest().encode() == data[-64:]
    names = set(zipfile.ZipFile(path).namelist())
    assert {"dflashctl/agent/probe/main.pyc", "dflashctl/sentinel/main.pyc", "__main__.pyc"} <= names
    pyc = zipfile.ZipFile(path).read("dflashctl/agent/verbs.pyc")
    assert pyc[:4] == __import__("importlib.util").util.MAGIC_NUMBER and pyc[4:8] == (1).to_bytes(4, "little")
    assert (folder.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)
    ran = boot(path, "check", str(tmp_path / "ws"))
    assert ran.returncode == 0 and agentcall.parse_replies(ran.stdout)[0]["workspace"] == {"writable": True}


def test_bytecode_of_another_python_falls_back_to_the_source(tmp_path: Path) -> None:
    """A pyc whose magic number is not this interpreter's (another Python ran the installer) is passed over."""
    folder = tmp_path / ".agent"
    assert install(folder).returncode == 0
    path = folder / f"{agentpack.sha256()}.pyz"
    src = zipfile.ZipFile(path)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            data = src.read(info)
            z.writestr(info, b"\0\0\0\0" + data[4:] if info.filename.endswith(".pyc") else data)
    body = out.getvalue()
    body = body[:-2] + (77).to_bytes(2, "little")
    path.write_bytes(body + agentinstall.TAG + hashlib.sha256(body).hexdigest().encode())
    ran = boot(path, "check", str(tmp_path))
    assert ran.returncode == 0 and agentcall.parse_replies(ran.stdout), ran.stderr


def test_the_installer_refuses_an_archive_that_arrived_damaged(tmp_path: Path) -> None:
    done = install(tmp_path / ".agent", data=agentpack.archive()[:-100])
    assert done.returncode == agentinstall.REFUSED and b"arrived damaged" in done.stdout
    assert not list((tmp_path).rglob("*.pyz"))


def test_the_bootstrap_runs_nothing_from_a_missing_partial_or_altered_file(tmp_path: Path) -> None:
    folder = tmp_path / ".agent"
    path = folder / f"{agentpack.sha256()}.pyz"
    assert boot(path, "check", str(tmp_path)).returncode == agentcall.MISSING_EXIT
    assert install(folder).returncode == 0
    whole = path.read_bytes()
    renamed = whole.replace(b"dflashctl/agent/verbs", b"dflashctl/agent/verbz")
    last = b"1" if whole.endswith(b"0") else b"0"  # the trailer's last hex digit, changed (it is "0" 1 time in 16)
    for bad in (whole[: len(whole) // 2], whole[:-1] + last, renamed):
        assert bad != whole
        path.write_bytes(bad)
        ran = boot(path, "check", str(tmp_path))
        assert (ran.returncode, ran.stdout.strip()) == (agentcall.MISSING_EXIT, agentcall.MISSING.encode())


def test_a_spec_verb_reads_its_spec_from_the_first_line_of_stdin_and_refuses_a_bad_one(tmp_path: Path) -> None:
    folder = tmp_path / ".agent"
    assert install(folder).returncode == 0
    path = folder / f"{agentpack.sha256()}.pyz"
    ran = boot(path, "mark", stdin=b"[1, 2]\n")
    assert ran.returncode == 2 and b"not a JSON object" in ran.stderr
    usage = subprocess.run([sys.executable, "-I", "-S", str(path), "nope"], capture_output=True, timeout=60)
    assert usage.returncode == 2 and b"usage: python3 AGENT.pyz" in usage.stderr
    sentinel = subprocess.run([sys.executable, "-I", "-S", str(path), "sentinel"], capture_output=True, timeout=60)
    assert sentinel.returncode == 2 and b"usage: python3 agent.pyz sentinel RUN_DIR" in sentinel.stderr


def test_an_editor_lock_file_or_a_dangling_module_symlink_in_the_package_changes_nothing(tmp_path, monkeypatch) -> None:
    package = tmp_path / "dflashctl"
    (package / "agent").mkdir(parents=True)
    (package / "agent" / "launcher.py").write_text("x = 1\n")
    monkeypatch.setattr(agentpack, "PACKAGE_DIR", package)
    clean = agentpack.signature()
    (package / "agent" / ".#launcher.py").symlink_to("user@host.1234:1700000000")  # emacs' lock: dangling
    (package / ".hidden").mkdir()
    (package / ".hidden" / "x.py").write_text("")
    assert agentpack.signature() == clean
    (package / "agent" / "gone.py").symlink_to(tmp_path / "nowhere.py")
    assert agentpack.signature() != clean  # a dangling module is noticed (the build names it), not a traceback


def test_every_verb_the_archive_answers_is_in_the_one_table_and_its_main_dispatches_nothing_else() -> None:
    from dflashctl.agent.verbs import VERBS

    assert "sentinel" in VERBS and "sentinel" not in agentpack.MAIN
    assert set(agentpack.ROOTS) == {"dflashctl.agent.verbs", *(f"dflashctl.{m}" for m, _, _ in VERBS.values())}


def test_the_bootstrap_and_the_installer_judge_every_folder_above_the_archive_alike(tmp_path: Path) -> None:
    """sshd's StrictModes rule in both (BOOT is text in argv and cannot import the installer's): each folder above
    the archive belongs to root or us and is writable by nobody else unless sticky, so nobody else can swap the file
    between BOOT's check and zipimport's re-opening of it."""
    import os

    sound = tmp_path / "sound"
    assert install(sound / ".agent").returncode == 0
    packed = (sound / ".agent" / f"{agentpack.sha256()}.pyz").read_bytes()
    shapes = {"group-writable": (0o775, None, True), "sticky": (0o1777, None, False),
              "foreign": (0o755, 65534, True), "above-other-writable": (0o757, None, True)}
    verdicts = {}
    for name, (mode, owner, refused) in {"sound": (0o700, None, False), **shapes}.items():
        top = tmp_path / name
        top.mkdir(exist_ok=True)
        folder = top / "x" / ".agent" if name == "above-other-writable" else top / ".agent"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        (folder / f"{agentpack.sha256()}.pyz").write_bytes(packed)
        os.chmod(top, mode)
        if owner is not None:
            os.chown(top, owner, owner)
        why = agentinstall.folder_problem(str(folder))
        ran = boot(folder / f"{agentpack.sha256()}.pyz", "check", str(tmp_path))
        verdicts[name] = (why is not None, ran.returncode == agentcall.MISSING_EXIT, refused)
        if refused:
            assert str(top) in why and ("writable by others" in why or "owned by uid 65534" in why)
    assert all(len(set(v)) == 1 for v in verdicts.values()), verdicts


def test_a_launch_whose_copy_of_the_archive_fails_its_trailer_hash_is_refused_in_one_line(tmp_path: Path) -> None:
    """The run's supervisor, sentinel and every attempt run `<run>/agent.pyz`: a copy that is not what BOOT checked
    (the file changed while it was copied) starts nothing."""
    import json

    folder = tmp_path / ".agent"
    assert install(folder).returncode == 0
    good = folder / f"{agentpack.sha256()}.pyz"
    bad = tmp_path / "changed.pyz"
    whole = good.read_bytes()
    bad.write_bytes(whole[:-1] + (b"1" if whole.endswith(b"0") else b"0"))  # the trailer's last digit, changed
    runs = tmp_path / "runs"
    runs.mkdir()
    for archive, started in ((bad, False), (good, True)):
        spec = {"cwd": str(tmp_path), "command": [sys.executable, "-c", "pass"], "runs_dir": str(runs),
                "base_id": f"run-{started}", "meta": {}}
        ran = subprocess.run([sys.executable, "-c", "import sys; from dflashctl.agent import launcher; "
                              "launcher.launch(__import__('json').loads(sys.argv[1]), sys.argv[2])",
                              json.dumps(spec), str(archive)], capture_output=True, timeout=120)
        (doc,) = agentcall.parse_replies(ran.stdout)
        if started:
            assert "error" not in doc, doc
        else:
            assert doc["error"] == "run-dir" and "trailer hash" in doc["message"] and "\n" not in doc["message"]
            assert not (runs / "run-False").exists()
