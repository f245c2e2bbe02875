"""Whom the ssh connection master trusts (issue 25): its folder must be a private real directory of ours (refused,
never repaired or followed, otherwise), whoever listens on its socket must run as our uid (and whoever connects to
the master too), its key carries the fingerprint of the code it runs, and `hosts disconnect` removes only files a
master wrote. Each of these failed on the tree before issue 25 (a folder open to others was chmod'ed, a symlinked
folder was followed and its `*.json` deleted, any listener was trusted, an edited CLI reused the old master)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.poll import wait_until
from harness.sshd import SshdServer

from dflashctl.errors import ConfigError
from dflashctl.model import Host
from dflashctl.remote import masterwire as wire
from dflashctl.remote.fingerprint import MASTER_CODE, PACKAGE_DIR, source_files, source_fingerprint
from dflashctl.remote.masterclient import MasterTransport, list_masters

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
NEVER_CONTACTED = Host(name="far", transport="ssh", address="pve.example.invalid", user="root", persist_s=60.0)
KEY = "0123456789abcdef0123"  # a name of the shape a master's files have


def cli(*args: str, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DFLASHCTL_STATE_DIR": str(state), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "dflashctl", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env=env)


def one_error_line(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ERROR:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def refused(place: wire.Place) -> str:
    with pytest.raises(ConfigError) as e:
        MasterTransport(NEVER_CONTACTED, place).run(["true"])
    assert int(e.value.exit_code) == 2
    return e.value.message


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state dir under a short path: a UNIX socket's name has ~107 bytes (tmp_path under xdist is longer)."""
    s = Path(tempfile.mkdtemp(prefix="dft-", dir="/tmp"))
    monkeypatch.setenv("DFLASHCTL_STATE_DIR", str(s))
    yield s
    shutil.rmtree(s, ignore_errors=True)


# -- the folder ------------------------------------------------------------------------------------------------------
def test_a_symlinked_masters_folder_is_refused_and_nothing_in_its_target_is_touched(state: Path):
    victim = state / "victim"
    victim.mkdir(mode=0o700)
    precious = {"notes.json": '{"a": 1}', f"{KEY}.json": json.dumps({"pid": 1, "host": "x"}), "other.txt": "x"}
    for name, text in precious.items():
        (victim / name).write_text(text)
    (state / "masters").symlink_to(victim)
    assert "is a symlink, not a directory" in refused(wire.place_for(NEVER_CONTACTED))
    res = cli("hosts", "disconnect", state=state)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "refusing the ssh master folder" in one_error_line(res) and "symlink" in res.stderr
    assert {p.name: p.read_text() for p in victim.iterdir()} == precious
    assert (state / "masters").is_symlink()


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701])
def test_a_masters_folder_open_to_others_is_refused_not_repaired(state: Path, mode: int):
    folder = state / "masters"
    folder.mkdir()
    folder.chmod(mode)
    assert f"has mode {mode:04o}; it must be 0700" in refused(wire.place_for(NEVER_CONTACTED))
    res = cli("hosts", "disconnect", state=state)
    assert res.returncode == 2 and "refusing the ssh master folder" in one_error_line(res)
    assert folder.stat().st_mode & 0o777 == mode  # left as it was: the user decides


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the folder to another user")
def test_a_masters_folder_owned_by_another_user_is_refused(state: Path):
    folder = state / "masters"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    assert f"is owned by uid {NOBODY}, not by you" in refused(wire.place_for(NEVER_CONTACTED))


def test_a_masters_folder_in_a_parent_others_can_write_is_refused(tmp_path: Path, monkeypatch):
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)  # not sticky: another user could rename our folder away and put theirs in its place
    monkeypatch.setenv("DFLASHCTL_STATE_DIR", str(parent))
    assert "is writable by others" in refused(wire.place_for(NEVER_CONTACTED))


def test_a_missing_masters_folder_and_its_missing_parents_are_made_0700(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DFLASHCTL_STATE_DIR", str(tmp_path / "a" / "b"))
    old = os.umask(0o002)  # a user-private group's umask: parents made 0775 by a plain makedirs
    try:
        wire.ensure_dir(wire.masters_dir())
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "masters"):
        assert folder.stat().st_mode & 0o777 == 0o700 and not folder.is_symlink(), folder


def test_a_parent_writable_by_our_own_group_only_is_accepted(tmp_path: Path, monkeypatch):
    parent = tmp_path / "home-like"
    parent.mkdir()
    os.chown(parent, os.getuid(), os.getgid())
    parent.chmod(0o775)
    monkeypatch.setenv("DFLASHCTL_STATE_DIR", str(parent))
    wire.ensure_dir(wire.masters_dir())
    if os.getuid() == 0:  # the same folder in another group is refused
        os.chown(parent, 0, NOBODY)
        assert "is writable by others" in refused(wire.place_for(NEVER_CONTACTED))


# -- what hosts disconnect removes --------------------------------------------------------------------------------
def test_disconnect_leaves_every_file_no_master_wrote(state: Path):
    folder = state / "masters"
    folder.mkdir(mode=0o700)
    place = wire.Place(folder, KEY)
    stale = {"master": wire.PROTOCOL, "pid": 2 ** 22 + 7, "host": "gone", "endpoint": "root@gone:22",
             "socket": str(place.sock)}  # a master's own info file whose master is gone: this one goes
    place.info.write_text(json.dumps(stale))
    keep = {"notes.json": '{"pid": 1}',
            "abcdefabcdefabcdef01.json": json.dumps({"pid": 1, "host": "x"}),  # no `master` field: not a master's
            "fedcbafedcbafedcba98.json": json.dumps({"master": 2, "pid": 1, "socket": "/elsewhere.sock"}),
            f"{KEY}.sock": "not a socket"}
    for name, text in keep.items():
        (folder / name).write_text(text)
    assert [m.place.key for m in list_masters(folder)] == [KEY]
    res = cli("hosts", "disconnect", state=state)
    assert res.returncode == 0 and "no ssh master was running" in res.stdout, res.stderr
    assert {p.name: p.read_text() for p in folder.iterdir()} == keep


# -- whom the socket connects ------------------------------------------------------------------------------------
_FOREIGN_LISTENER = textwrap.dedent("""
    import os, socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sys.argv[1])
    os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[2]))  # SO_PEERCRED: the uid at listen()
    s.listen(4)
    print("ready", flush=True)
    c, _ = s.accept()
    c.settimeout(30)
    got = b""
    try:
        while chunk := c.recv(65536):
            got += chunk
    except OSError:
        pass
    print(len(got), flush=True)
""")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another user")
def test_a_socket_held_by_another_user_is_refused_before_anything_is_sent(state: Path):
    folder = state / "masters"
    wire.ensure_dir(folder)
    place = wire.place_for(NEVER_CONTACTED)
    fake = subprocess.Popen([sys.executable, "-c", _FOREIGN_LISTENER, str(place.sock), str(NOBODY)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout is not None and fake.stdout.readline() == "ready\n"
        message = refused(place)
        assert f"refusing the ssh master socket: the process behind the socket runs as uid {NOBODY}" in message
        assert fake.stdout.readline() == "0\n"  # it heard nothing: no argv, no stdin, no --env secrets
    finally:
        fake.kill()
        fake.wait()


_CLIENT_AS = textwrap.dedent("""
    import ctypes, os, socket, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    if int(sys.argv[2]):
        os.seteuid(int(sys.argv[2]))  # SO_PEERCRED reports this uid to the master ...
        libc.setfsuid(0)              # ... while files are still opened as root (the folder is root's, 0700)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    body = b'{"op": "run", "argv": ["echo", "secret"], "timeout": 30, "stream": false, "stdin": false}'
    s.settimeout(30)
    got = b""
    try:
        s.sendall(struct.pack(">cI", b"R", len(body)) + body + struct.pack(">cI", b"i", 0))
        while b"secret" not in got and (chunk := s.recv(65536)):
            got += chunk
    except (BrokenPipeError, ConnectionResetError):
        pass
    print(b"secret" in got, len(got))
""")


@pytest.fixture
def server(sshd_server: SshdServer, fresh_masters: Path, monkeypatch: pytest.MonkeyPatch) -> SshdServer:
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(sshd_server.known_hosts))
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", os.devnull)
    return sshd_server


def ssh_host(server: SshdServer) -> Host:
    return Host(name="m", transport="ssh", address=server.address, port=server.port, user="root",
                identity_file=str(server.client_key), persist_s=300.0)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_the_master_answers_no_client_of_another_user(server: SshdServer):
    host = ssh_host(server)
    transport = MasterTransport(host)
    assert transport.run(["echo", "mine"]).stdout == b"mine\n"  # the master is up and serves us
    def client_as(uid: int) -> str:
        res = subprocess.run([sys.executable, "-c", _CLIENT_AS, str(transport.place.sock), str(uid)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert client_as(NOBODY) == "False 0\n"  # hung up on: nothing ran, nothing answered
    assert client_as(0).startswith("True ")  # the same request as our own uid runs
    assert transport.run(["echo", "still"]).stdout == b"still\n"


# -- the code a master runs ----------------------------------------------------------------------------------------
def _imports_of(module: str) -> set[str]:
    """dflashctl modules `module` imports, directly or through others, at top level or lazily (static, from ast)."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = REPO.joinpath(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            todo += [n for n in names if n.split(".")[0] == "dflashctl"]
    return {n for n in seen if REPO.joinpath(*n.split(".")).with_suffix(".py").is_file()
            or (REPO.joinpath(*n.split(".")) / "__init__.py").is_file()}


def test_the_fingerprint_covers_every_module_the_master_can_import():
    covered = {p.relative_to(PACKAGE_DIR).as_posix() for p in source_files(PACKAGE_DIR, MASTER_CODE)}
    for name in _imports_of("dflashctl.remote.master"):
        rel = "/".join(name.split(".")[1:])
        assert f"{rel}.py" in covered or f"{rel}/__init__.py" in covered or (rel == "" and "__init__.py" in covered), \
            f"the master imports {name}, which its fingerprint (fingerprint.MASTER_CODE) does not cover"


def test_the_fingerprint_changes_with_any_byte_of_the_masters_code_and_only_with_it(tmp_path: Path):
    copy = tmp_path / "dflashctl"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = source_fingerprint(copy, MASTER_CODE)
    assert before == source_fingerprint(PACKAGE_DIR, MASTER_CODE)
    (copy / "cli" / "app.py").write_text((copy / "cli" / "app.py").read_text() + "# a CLI edit\n")
    assert source_fingerprint(copy, MASTER_CODE) == before
    ssh = copy / "remote" / "ssh.py"
    ssh.write_text(ssh.read_text().replace("import", "import ", 1))
    assert source_fingerprint(copy, MASTER_CODE) != before


_CLIENT = textwrap.dedent("""
    import json, sys
    from dflashctl.model import Host
    from dflashctl.remote import masterwire as wire
    from dflashctl.remote.masterclient import MasterTransport
    host = Host(**json.loads(sys.argv[1]))
    t = MasterTransport(host)
    assert t.run(["true"]).ok
    print(json.dumps(wire.read_info(t.place.info)))
""")


def test_an_edited_cli_never_talks_to_the_master_of_the_code_before(server: SshdServer, fresh_masters: Path,
                                                                    tmp_path: Path):
    root = tmp_path / "install"
    shutil.copytree(PACKAGE_DIR, root / "dflashctl", ignore=shutil.ignore_patterns("__pycache__"))
    host = ssh_host(server)
    doc = json.dumps({f: getattr(host, f) for f in ("name", "transport", "address", "user", "port",
                                                     "identity_file", "persist_s")})

    def through_master() -> dict:
        env = {**os.environ, "PYTHONPATH": str(root)}
        res = subprocess.run([sys.executable, "-c", _CLIENT, doc], capture_output=True, text=True, env=env,
                             cwd=root, timeout=120)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    first = through_master()
    assert through_master()["pid"] == first["pid"]  # same code: the same master
    transport = root / "dflashctl" / "remote" / "transport.py"
    transport.write_text(transport.read_text() + "\n# upgraded\n")
    second = through_master()
    assert second["pid"] != first["pid"] and second["socket"] != first["socket"]
    wait_until(lambda: {m.pid for m in list_masters(fresh_masters)} >= {first["pid"], second["pid"]},
               what="both masters listed")


def test_disconnect_in_a_folder_too_deep_for_a_socket_name_ends_nothing_and_says_so(state: Path):
    deep = state / ("d" * 100)
    deep.mkdir(mode=0o700)
    folder = deep / "masters"
    folder.mkdir(mode=0o700)
    place = wire.Place(folder, KEY)
    assert not wire.fits(place)
    place.info.write_text(json.dumps({"master": wire.PROTOCOL, "pid": 2 ** 22 + 7, "host": "gone",
                                      "socket": str(place.sock)}))
    res = cli("hosts", "disconnect", state=deep)
    assert res.returncode == 0 and "no ssh master was running" in res.stdout, res.stderr
    assert not place.info.exists()  # the stale info file a master wrote goes; nothing else was there
