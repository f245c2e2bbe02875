"""What ships and how it is hashed: the same code decides here and in the container."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from harness.agentpyz import archive_path, spec_stdin

from dflashctl.agent import codetree
from dflashctl.remote.agentcall import parse_replies


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
    res = subprocess.run([sys.executable, archive_path(), "code-install"],
                         input=spec_stdin({"workspace": str(ws), "hash": digest}, data), capture_output=True,
                         timeout=30)
    return parse_replies(res.stdout)[-1]


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
    bad = _install(ws, codetree.pack(str(t), "trainer"), "f" * 64)
    assert "hash mismatch" in bad["error"] and (ws / "code" / "old.py").exists()
    digest = codetree.tree_hash(str(t), "trainer")
    ok = _install(ws, codetree.pack(str(t), "trainer"), digest)
    assert ok["hash"] == digest and (ws / "code").is_symlink()
    assert (Path(ok["moved_legacy"]) / "old.py").read_text() == "hand-copied with scp"
    assert (ws / "code" / "trainer" / "configs" / "a.toml").is_file()
    assert codetree.tree_hash(str(ws / "code")) == digest  # the hash of what lands is the hash of code/ itself


# ------------------------------------------------------------------------ .gitignore, judged against git


ROOT_IGNORE = """\
# a comment, then a blank line

*.log
!keep.log
/only-root.txt
out/
docs/**/*.tmp
**/gen
data/*
!data/small.csv
a/**/z.txt
build2/
!build2/keep.txt
\\#literal
\\!bang.txt
spaced.txt   \n\
[abc]x.py
[!a]y.txt
q?.txt
"""
SUB_IGNORE = "!*.log\nlocal-only\n/anchored.txt\n"
FILES = [
    "app.log", "keep.log", "sub/x.log", "sub/deeper/y.log", "only-root.txt", "sub/only-root.txt",
    "out/a.txt", "sub/out/b.txt", "sub2/out", "docs/a/b/c.tmp", "docs/c.tmp", "docs/keep.md", "x/gen/f.py", "gen",
    "data/big.bin", "data/small.csv", "a/z.txt", "a/b/c/z.txt", "a/y.txt", "build2/keep.txt", "#literal",
    "!bang.txt", "spaced.txt", "ax.py", "dx.py", "by.txt", "ay.txt", "q1.txt", "q12.txt", "sub/local-only",
    "sub/anchored.txt", "sub/deeper/anchored.txt", "train.py",
]
SHIPPED = [
    ".gitignore", "a/y.txt", "ay.txt", "data/small.csv", "docs/keep.md", "dx.py", "keep.log", "q12.txt",
    "sub/.gitignore", "sub/deeper/anchored.txt", "sub/deeper/y.log", "sub/only-root.txt", "sub/x.log", "sub2/out",
    "train.py",
]


def ignore_tree(root: Path) -> Path:
    root.mkdir()
    (root / ".gitignore").write_text(ROOT_IGNORE)
    (root / "sub").mkdir()
    (root / "sub" / ".gitignore").write_text(SUB_IGNORE)
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    return root


def git_would_track(root: Path, tmp_path: Path) -> list[str]:
    """What `git add .` would take in a fresh repository (no user or system git config read)."""
    env = {"HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "PATH": os.environ.get("PATH", "")}
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--others", "--exclude-standard"],
                         check=True, capture_output=True, env=env).stdout.decode()
    shutil.rmtree(root / ".git")
    return sorted(p for p in out.split("\0") if p)


def test_gitignore_rules_pick_the_files_git_would(tmp_path):
    root = ignore_tree(tmp_path / "proj")
    assert codetree.iter_files(str(root)) == SHIPPED
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the listing was checked against the expected one only")
    assert git_would_track(root, tmp_path) == SHIPPED


def test_dflashignore_comes_after_gitignore_and_the_defaults_can_be_brought_back(tmp_path):
    root = tmp_path / "proj"
    for rel in ("train.py", "notes.md", "checkpoints/step1.pt", "build/gen.py", "wandb/run-1/log",
                "pkg/__pycache__/m.cpython-311.pyc", "pkg/m.py", "pkg/m.pyc", "env/pyvenv.cfg", "env/lib/site.py",
                ".git/HEAD", "node_modules/x/index.js", codetree.HASH_FILE):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".gitignore").write_text("notes.md\n")
    (root / ".dflashignore").write_text("!notes.md\n!build/\n!.git/\n!__pycache__/\n")
    assert codetree.iter_files(str(root)) == [".dflashignore", ".gitignore", "build/gen.py", "notes.md",
                                              "pkg/m.py", "train.py"]
    (root / "link.py").symlink_to(root / "train.py")
    assert "link.py" not in codetree.iter_files(str(root))  # symlinks never ship


def test_a_version_edited_in_place_is_set_aside_and_installed_afresh(tmp_path):
    t = make_tree(tmp_path / "src")
    ws = tmp_path / "ws"
    digest = codetree.tree_hash(str(t), "trainer")
    first = _install(ws, codetree.pack(str(t), "trainer"), digest)
    edited = ws / "code" / "trainer" / "__init__.py"
    edited.write_text("# hand edit in the container\n")
    assert codetree.tree_hash(str(ws / "code")) != digest
    again = _install(ws, codetree.pack(str(t), "trainer"), digest)
    assert again["path"] == first["path"] and again["set_aside"]
    assert codetree.tree_hash(str(ws / "code")) == digest and edited.read_text() == ""
    assert (Path(again["set_aside"]) / "trainer" / "__init__.py").read_text() == "# hand edit in the container\n"
