"""Calls through the agent archive on a real target (the local transport, real interpreters): the archive is sent
once, where it is missing, and never again while it is sound; an unsafe folder is refused in one line; a spec never
reaches any process's argv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflashctl.errors import ExitCode, RemoteFailed
from dflashctl.remote import agentcall, agentpack


class Recorder:
    """Every command the target's (real) transport runs: its argv, and whether it carried the archive."""

    def __init__(self, target) -> None:  # noqa: ANN001
        self.argvs: list[list[str]] = []
        self.stdins: list[bytes] = []
        inner = target.transport.run

        def run(argv, *, stdin=None, timeout=None):  # noqa: ANN001, ANN202
            self.argvs.append(list(argv))
            self.stdins.append(stdin or b"")
            return inner(argv, stdin=stdin, timeout=timeout)

        target.transport.run = run

    @property
    def installs(self) -> int:
        return sum(1 for s in self.stdins if s == agentpack.archive())


def check_doc(target) -> dict:  # noqa: ANN001
    res = agentcall.run(target, "check", target.host.workspace, timeout=120)
    (doc,) = agentcall.parse_replies(res.out)
    return doc


def test_a_missing_archive_is_installed_once_and_later_calls_do_not_send_it(local_host) -> None:
    with local_host.connect() as target:
        seen = Recorder(target)
        assert check_doc(target)["workspace"] == {"writable": True}
        assert seen.installs == 1 and len(seen.argvs) == 3  # the call, the install, the call again
        for _ in range(3):
            check_doc(target)
        assert seen.installs == 1 and len(seen.argvs) == 6
    assert Path(agentcall.path(target)).is_file()


def test_an_altered_or_partial_archive_is_installed_again_not_run(local_host) -> None:
    with local_host.connect() as target:
        seen = Recorder(target)
        check_doc(target)
        path = Path(agentcall.path(target))
        whole = path.read_bytes()
        mid = len(whole) // 2
        for bad in (whole[: len(whole) // 3], whole[:mid] + bytes([whole[mid] ^ 1]) + whole[mid + 1:]):
            path.write_bytes(bad)
            assert check_doc(target)["workspace"] == {"writable": True}
        assert seen.installs == 3 and path.read_bytes() == whole  # the same bytes for the same interpreter


def test_an_archive_of_another_version_beside_it_does_not_matter(local_host) -> None:
    folder = Path(local_host.host.workspace) / ".agent"
    folder.mkdir(mode=0o700, parents=True)
    os.chmod(folder, 0o700)
    other = folder / f"{'0' * 64}.pyz"
    other.write_bytes(b"an older dflashctl's archive")
    with local_host.connect() as target:
        seen = Recorder(target)
        check_doc(target)
        check_doc(target)
        assert seen.installs == 1 and other.read_bytes() == b"an older dflashctl's archive"


def test_an_install_keeps_only_the_newest_older_archives_and_clears_interrupted_ones(local_host) -> None:
    from dflashctl.agent.agentinstall import KEEP

    folder = Path(local_host.host.workspace) / ".agent"
    folder.mkdir(mode=0o700, parents=True)
    os.chmod(folder, 0o700)
    olds = []
    for i in range(KEEP + 2):  # oldest first
        old = folder / f"{i:064d}.pyz"
        old.write_bytes(b"an older dflashctl's archive")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
        olds.append(old)
    torn = folder / f"{'f' * 64}.pyz.tmp-12345"
    torn.write_bytes(b"half of an install")
    os.utime(torn, (1_000_000, 1_000_000))
    racing = folder / f"{'e' * 64}.pyz.tmp-12346"  # another install's, being written now
    racing.write_bytes(b"another install in flight")
    mine = folder / "notes.txt"  # not ours to remove
    mine.write_text("kept")
    with local_host.connect() as target:
        check_doc(target)
        assert Path(agentcall.path(target)).is_file()
    assert [p.exists() for p in olds] == [False] * 2 + [True] * KEEP
    assert not torn.exists() and racing.exists() and mine.read_text() == "kept"


@pytest.mark.parametrize("make", ["symlink", "group-writable", "foreign"])
def test_an_agent_folder_that_is_not_ours_alone_is_refused_in_one_line(local_host, tmp_path, make) -> None:
    folder = Path(local_host.host.workspace) / ".agent"
    folder.parent.mkdir(parents=True, exist_ok=True)
    if make == "symlink":
        real = tmp_path / "elsewhere"
        real.mkdir(mode=0o700)
        folder.symlink_to(real)
    else:
        folder.mkdir(mode=0o700)
        if make == "group-writable":
            os.chmod(folder, 0o770)
        else:
            os.chown(folder, 65534, 65534)
    with local_host.connect() as target, pytest.raises(RemoteFailed) as got:
        check_doc(target)
    assert got.value.exit_code == ExitCode.REMOTE_FAILED and "\n" not in got.value.message
    assert {"symlink": "is a symlink", "group-writable": "writable by others", "foreign": "owned by uid 65534"}[make] \
        in got.value.message and ".agent" in (got.value.hint or "")
    assert not list(folder.glob("*.pyz"))


def test_a_spec_never_appears_in_any_commands_argv(local_host) -> None:
    """A launch spec carries --env values: they go on stdin, to the install and the call alike."""
    secret = "s3cr3t-token-value"
    with local_host.connect() as target:
        seen = Recorder(target)
        doc = agentcall.call(target, "mark", {"run_dir": f"{target.host.workspace}/runs/nope", "run_id": secret},
                             timeout=60)
        assert isinstance(doc, dict) and seen.installs == 1
        assert not any(secret in arg for argv in seen.argvs for arg in argv)
        assert any(secret.encode() in s for s in seen.stdins)


def test_a_watch_started_where_the_archive_is_missing_installs_it_and_streams(local_host) -> None:
    with local_host.connect() as target:
        seen = Recorder(target)
        lines = agentcall.stream(target, "probe", "--workspace", target.host.workspace, "--watch", "--interval", "0.2")
        try:
            docs = [d for d in map(agentcall.parse_reply, (next(lines).decode() for _ in range(2))) if d is not None]
        finally:
            lines.close()
        assert len(docs) == 2 and docs[0]["probe_version"] and seen.installs == 1


@pytest.mark.parametrize("make", ["under-a-file", "unwritable"])
def test_hosts_check_runs_every_check_and_names_a_workspace_the_archive_cannot_be_installed_in(
        local_host, make, tmp_path, monkeypatch) -> None:
    from dataclasses import replace

    from dflashctl.commands.hosts import check_host

    base = Path(local_host.host.workspace)
    base.parent.mkdir(parents=True, exist_ok=True)
    if make == "under-a-file":
        blocker = base.parent / "a-file"
        blocker.write_text("a file, not a folder")
        host = replace(local_host.host, workspace=str(blocker / "ws"))
    else:
        base.mkdir(exist_ok=True)
        (base / ".agent").write_text("in the way")  # the install cannot make its folder; root ignores modes
        host = replace(local_host.host, workspace=str(base))
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))  # where the private install goes (the target inherits it)
    report = check_host(host, timeout=120)
    checks = {c.name: c for c in report.checks}
    assert checks["python"].status == "ok", checks["python"].detail
    assert checks["workspace"].status == "fail" if make == "under-a-file" else checks["workspace"].status == "ok"
    if make == "under-a-file":
        assert "not writable" in checks["workspace"].detail
    assert all(c.status != "skip" or c.name in ("container", "devices", "driver") for c in report.checks)
    assert not list(private_tmp.iterdir())  # the private install is gone


def test_a_watch_whose_archive_is_rewritten_right_after_its_install_fails_in_one_line(local_host) -> None:
    """The second attempt of a stream meets MISSING again: the same one-line error as run(), not MISSING passed on
    as if it were the program's output."""
    with local_host.connect() as target:
        inner = target.transport.run

        def run(argv, *, stdin=None, timeout=None):  # noqa: ANN001, ANN202
            res = inner(argv, stdin=stdin, timeout=timeout)
            if stdin == agentpack.archive():  # the install: something rewrites the folder right after it
                Path(agentcall.path(target)).write_bytes(b"rewritten")
            return res

        target.transport.run = run
        lines = agentcall.stream(target, "probe", "--workspace", target.host.workspace, "--watch", "--interval", "0.2")
        with pytest.raises(RemoteFailed) as got:
            next(lines)
        lines.close()
    assert "does not pass the bootstrap's check" in got.value.message and "\n" not in got.value.message


def test_a_call_whose_program_replies_nothing_is_a_remote_failure_in_one_line(local_host) -> None:
    """No reply from the container is 106 (REMOTE_FAILED), not 100: scripts must not read it as a crashed run."""
    with local_host.connect() as target, pytest.raises(RemoteFailed) as got:
        agentcall.call(target, "mark", {"not": "a mark spec"})
    assert got.value.exit_code == ExitCode.REMOTE_FAILED and "gave no result" in got.value.message
    assert "\n" not in got.value.message
