"""deploy under faults: a file it cannot read is one line naming it (as a user who is not root), and the container's
unpacking folder (`.code/.tmp-PID-T`, which pruning skips) is gone after every signal the install can catch and
after the next deploy when a SIGKILL left it."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agentpyz import archive_path, spec_stdin
from harness.poll import wait_until

from dflashctl.remote.agentcall import parse_replies

NOBODY = 65534


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A folder another user can reach (pytest's tmp_path is root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="dflash-faults-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the CLI as another user (setpriv)")
def test_a_file_under_source_that_the_user_cannot_read_is_one_line_naming_it(world_dir):
    src = world_dir / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    secret = src / "secret.txt"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    ws = world_dir / "ws"
    ws.mkdir()
    os.chown(ws, NOBODY, NOBODY)
    hosts = world_dir / "hosts.toml"
    hosts.write_text(f'default = "l"\n[hosts.l]\ntransport = "local"\nworkspace = "{ws}"\n'
                     'python = "/usr/bin/python3"\n')  # the container programs are stdlib only
    for argv in (["deploy", "--check"], ["deploy"]):
        res = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                              sys.executable, "-m", "dflashctl", *argv, "--source", str(src), "--hosts", str(hosts)],
                             capture_output=True, text=True, timeout=120, cwd=world_dir,
                             env={**os.environ, "HOME": str(world_dir)})
        assert res.returncode == 2, (argv, res.returncode, res.stderr)
        assert res.stderr.splitlines()[0] == f"ERROR: cannot read {secret}: Permission denied", res.stderr
        assert "Traceback" not in res.stderr
    assert not (ws / "code").exists()


INSTALL = [sys.executable, archive_path(), "code-install"]  # what `deploy` runs in the container (agent/codetree.py)


def _install_spec(workspace: Path, tree_hash: str) -> bytes:
    return spec_stdin({"workspace": str(workspace), "hash": tree_hash})


def _tar_gz_head() -> bytes:
    """The first bytes of a gzip tar of one 4 MiB file: enough for install to make its folder and start."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        data = os.urandom(4 << 20)
        info = tarfile.TarInfo("big.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()[: 1 << 20]


def _stalled_install(workspace: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """install() with half a tar on its stdin and the rest never coming: its .tmp-PID-T folder, mid-unpack."""
    proc = subprocess.Popen(INSTALL, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(_install_spec(workspace, "0" * 64) + _tar_gz_head())
    proc.stdin.flush()
    versions = workspace / ".code"
    wait_until(lambda: list(versions.glob(f".tmp-{proc.pid}-*/big.bin")), 60, "install to start unpacking")
    (tmp,) = versions.glob(f".tmp-{proc.pid}-*")
    return proc, tmp


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_an_install_ended_by_a_catchable_signal_removes_its_unpacking_folder(tmp_path, sig):
    proc, tmp = _stalled_install(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not tmp.exists(), err.decode()
    assert sorted(p.name for p in (tmp_path / ".code").iterdir()) == []


def test_the_next_deploy_removes_what_a_sigkilled_install_left(local_host, cli, tmp_path):
    ws = local_host.workspace_dir
    proc, tmp = _stalled_install(ws)
    proc.kill()
    proc.communicate(timeout=60)
    assert tmp.is_dir()  # SIGKILL cannot be caught
    live = ws / ".code" / f".tmp-{os.getpid()}-1"  # an install running now (our pid) is never touched
    live.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    res = cli("deploy", "--source", str(src), "--json")
    assert res.code == 0, res.err
    assert not tmp.exists() and live.is_dir()
    assert json.loads(res.out)["changed"] is True


def test_install_replies_still_parse_after_the_signal_guard():
    """The guard wraps the program's entry; a whole tar still installs and replies (a plain regression check)."""
    with tempfile.TemporaryDirectory() as d:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            info = tarfile.TarInfo("a.py")
            info.size = 2
            tar.addfile(info, io.BytesIO(b"1\n"))
        from dflashctl.agent import codetree

        Path(d, "t").mkdir()
        Path(d, "t", "a.py").write_text("1\n")
        want = codetree.tree_hash(str(Path(d, "t")))
        res = subprocess.run(INSTALL, input=_install_spec(Path(d, "ws"), want) + buf.getvalue(),
                             capture_output=True, timeout=60)
        (doc,) = parse_replies(res.stdout)
        assert doc["hash"] == want, doc
