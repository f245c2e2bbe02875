"""What ships and how it is hashed: the same code decides here and in the container."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from dflashctl.remote import codetree
from dflashctl.remote.scripts import build_call, module_source


def make_tree(root: Path) -> Path:
    t = root / "trainer"
    (t / "configs").mkdir(parents=True)
    (t / "__init__.py").write_text("")
    (t / "configs" / "a.toml").write_text("x = 1\n")
    for junk in ("__pycache__/m.cpython-311.pyc", ".venv/bin/python", ".pytest_cache/v", "x.egg-info/PKG-INFO"):
        (t / junk).parent.mkdir(parents=True, exist_ok=True)
        (t / junk).write_text("junk")
    (t / "stale.pyc").write_bytes(b"\0")
    return t


def test_only_source_files_ship(tmp_path):
    t = make_tree(tmp_path)
    assert codetree.iter_files(str(t)) == ["__init__.py", "configs/a.toml"]


def test_the_hash_ignores_caches_and_sees_content_and_the_exec_bit(tmp_path):
    t = make_tree(tmp_path)
    h = codetree.tree_hash(str(t))
    (t / "__pycache__" / "new.pyc").write_text("more junk")
    assert codetree.tree_hash(str(t)) == h
    (t / "configs" / "a.toml").write_text("x = 2\n")
    h2 = codetree.tree_hash(str(t))
    assert h2 != h
    (t / "configs" / "a.toml").chmod(0o755)
    assert codetree.tree_hash(str(t)) != h2


def test_pack_is_deterministic(tmp_path):
    t = make_tree(tmp_path)
    a = codetree.pack(str(t))
    (t / "__init__.py").touch()  # a new mtime changes nothing that ships
    assert codetree.pack(str(t)) == a


def _install(ws: Path, data: bytes, digest: str) -> dict:
    prog = build_call(module_source("codetree"), "install", {"workspace": str(ws), "hash": digest})
    res = subprocess.run([sys.executable, "-c", prog], input=data, capture_output=True, timeout=30)
    return json.loads(res.stdout.decode().splitlines()[-1].split(" ", 1)[1])


def test_install_refuses_paths_outside_the_tree(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("trainer/../../evil.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    out = _install(tmp_path / "ws", buf.getvalue(), "0" * 64)
    assert "refusing tar member" in out["error"]
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "ws" / "code").exists()


def test_install_verifies_the_hash_and_swaps_a_legacy_directory_aside(tmp_path):
    t = make_tree(tmp_path / "src")
    ws = tmp_path / "ws"
    (ws / "code").mkdir(parents=True)
    (ws / "code" / "old.py").write_text("hand-copied with scp")
    bad = _install(ws, codetree.pack(str(t)), "f" * 64)
    assert "hash mismatch" in bad["error"] and (ws / "code" / "old.py").exists()
    digest = codetree.tree_hash(str(t))
    ok = _install(ws, codetree.pack(str(t)), digest)
    assert ok["hash"] == digest and (ws / "code").is_symlink()
    assert (Path(ok["moved_legacy"]) / "old.py").read_text() == "hand-copied with scp"
    assert codetree.tree_hash(str(ws / "code" / "trainer")) == digest
