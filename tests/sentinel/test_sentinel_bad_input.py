"""Bad sentinel flags on `launch`: each is exit code 2 with one ERROR line (and its HINT) on stderr, never a
traceback, and nothing launched — no run directory, no `latest`. Malformed values are refused before the container is
contacted; a notify URL the container cannot reach is refused by the launcher's TCP connect, before it creates
anything (on the `local` host, and once through ssh + `pct exec`)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from lifecycle.conftest import _no_run_outlives_its_test  # noqa: F401 - autouse: no run outlives its test

from .conftest import CliResult, run_dirs, write_prog

pytestmark = pytest.mark.timeout(180)


def closed_port() -> int:
    """A port of 127.0.0.1 that was just bound and closed: a connect to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_error_line(res: CliResult) -> str:
    """The ERROR line of a refused command (asserting exit 2, no traceback, nothing but ERROR and HINT lines)."""
    assert res.code == 2, (res.code, res.out, res.err)
    assert "Traceback" not in res.err and "Traceback" not in res.out
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR: ")]
    assert len(errors) == 1 and all(ln.startswith(("ERROR: ", "HINT: ")) for ln in lines), res.err
    return errors[0]


def launch_refused(cli, ws: Path, src: Path, *flags: str) -> str:  # noqa: ANN001 - the cli fixture
    res = cli("launch", "--source", str(src), *flags, "--exec", "--", "python3", "prog.py")
    line = one_error_line(res)
    assert "launched run" not in res.out
    assert run_dirs(ws) == [] and not (ws / "runs" / "latest").exists()  # nothing was created
    return line


@pytest.fixture
def src(local_host, cli, tmp_path) -> Path:
    """The program, deployed already: a refused launch has nothing else to say (no `deployed …` note)."""
    directory = write_prog(tmp_path / "myproject")
    assert cli("deploy", "--source", str(directory)).code == 0
    return directory


@pytest.mark.parametrize(("flags", "said"), [
    (("--notify", "ftp://x"), "notify URL 'ftp://x' is not an http(s) URL"),
    (("--notify", "webhook:not-a-url"), "notify URL 'not-a-url' is not an http(s) URL"),
    (("--notify-on", "crash"), "unknown event kind 'crash'"),
    (("--idle-limit", "5@30m"), "idle limit '5@30m' is not UTIL%@DURATION"),
    (("--idle-limit", "5%@0"), "'0' must be longer than 0 s"),
    (("--stall-limit", "abc"), "stall limit 'abc' is not a duration"),
    (("--max-restarts", "2"), "--max-restarts without --restart-on"),
    (("--restart-on", "exploded"), "exploded is not a restartable ending"),
    (("--restart-on", "nccl-timeout,import-error"), "import-error is never restarted"),
    (("--no-sentinel", "--notify", "http://127.0.0.1:1/x"), "--no-sentinel leaves nobody to notify"),
], ids=["ftp-url", "webhook-not-a-url", "unknown-kind", "idle-without-percent", "idle-zero-time", "stall-abc",
        "max-restarts-alone", "restart-on-unknown", "restart-on-import-error", "no-sentinel-with-notify"])
def test_a_malformed_sentinel_flag_is_one_line_exit_2_and_launches_nothing(local_host, cli, src, flags, said):
    line = launch_refused(cli, local_host.workspace_dir, src, *flags)
    assert said in line, line


def test_a_notify_url_refusing_connections_is_one_line_exit_2_and_launches_nothing(local_host, cli, src):
    port = closed_port()
    line = launch_refused(cli, local_host.workspace_dir, src, "--notify", f"http://127.0.0.1:{port}/x")
    assert f"notify target webhook http://127.0.0.1:{port} is unreachable from the container" in line, line
    assert "refused" in line.lower()


def test_a_notify_host_that_never_resolves_is_one_line_exit_2_and_launches_nothing(local_host, cli, src):
    line = launch_refused(cli, local_host.workspace_dir, src, "--notify", "https://hooks.example.invalid/x")
    assert "notify target webhook https://hooks.example.invalid:443 is unreachable" in line, line


def test_the_second_of_two_notify_urls_unreachable_still_launches_nothing(local_host, cli, src):
    """Every target is checked, not only the first one; the URL's path (a possible token) is not repeated."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        good = f"http://127.0.0.1:{listening.getsockname()[1]}/ok"
        port = closed_port()
        line = launch_refused(cli, local_host.workspace_dir, src, "--notify", good, "--notify",
                              f"slack:http://127.0.0.1:{port}/T0KEN")
    assert f"notify target slack http://127.0.0.1:{port} is unreachable" in line and "T0KEN" not in line, line


@pytest.mark.slow
def test_a_notify_url_the_container_cannot_reach_is_refused_through_ssh_and_pct(pve, cli, tmp_path):
    directory = write_prog(tmp_path / "myproject")
    assert cli("deploy", "--source", str(directory)).code == 0
    port = closed_port()
    line = launch_refused(cli, pve.workspace_dir / "dflash", directory, "--notify", f"http://127.0.0.1:{port}/x")
    assert f"http://127.0.0.1:{port} is unreachable from the container" in line, line
