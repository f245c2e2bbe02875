"""Property: an argv of arbitrary strings and arbitrary stdin bytes arrive byte-exact at the far side,
through every way dflashctl reaches a machine (local, ssh, ssh + pct exec). The far side is
`argv-dump`, which prints each argument + NUL and then copies stdin."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from harness.envs import PveEnv
from harness.sshd import BIN, SshdServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashctl.model import Host
from dflashctl.remote import connect
from dflashctl.remote.target import Target

# Any character but NUL (argv cannot carry it) and lone surrogates (not encodable): spaces, quotes,
# $(), backticks, newlines, globs, backslashes and non-ASCII all included. Weighted towards the
# characters shells care about so each run exercises them.
SHELLY = st.sampled_from(list(" '\"$`\\\n\t;&|<>*?![]{}()~#=%-") + ["$(id)", "`id`", "${HOME}", "é", "日本", "\u202e"])
CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
ARG = st.lists(st.one_of(SHELLY, CHARS), max_size=24).map("".join)
ARGV = st.lists(ARG, max_size=8)
STDIN = st.one_of(st.none(), st.binary(max_size=2048))

PROPERTY = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def roundtrip(target: Target, argv: list[str], stdin: bytes | None) -> None:
    res = target.run([str(BIN / "argv-dump"), *argv], stdin=stdin, timeout=60)
    assert res.exit_code == 0, res.err
    expected = b"".join(a.encode() + b"\0" for a in argv) + (stdin or b"")
    assert res.stdout == expected
    assert res.stderr == b""


PERSIST = {"master": 300.0, "in-process": 0.0}  # through a connection master, and without one (persist = 0)


@pytest.fixture(scope="module", params=list(PERSIST))
def ssh_host(sshd_server: SshdServer, request: pytest.FixtureRequest) -> Iterator[Target]:
    """One persistent ssh connection (no container) for the whole module."""
    host = Host(name="ssh", transport="ssh", address=sshd_server.address, port=sshd_server.port, user="root",
                identity_file=str(sshd_server.client_key), persist_s=PERSIST[request.param])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASHCTL_KNOWN_HOSTS", str(sshd_server.known_hosts))
        mp.setenv("DFLASHCTL_SSH_CONFIG", "/dev/null")
        with connect(host) as target:
            yield target


@pytest.fixture(scope="module", params=list(PERSIST))
def pct_host(sshd_server: SshdServer, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[Target]:
    """ssh + `pct exec CTID --` into a running test container, one connection for the module."""
    env = PveEnv(sshd_server, tmp_path_factory.mktemp("pct-roundtrip"))
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.env.items():
                mp.setenv(k, v)
            with connect(replace(env.host, persist_s=PERSIST[request.param])) as target:
                assert target.transport.name == "ssh" and (type(target.transport).__name__ == "MasterTransport") \
                    == (request.param == "master")
                yield target
    finally:
        env.close()


@pytest.mark.slow
@PROPERTY
@given(argv=ARGV, stdin=STDIN)
def test_argv_and_stdin_arrive_byte_exact_through_local(argv: list[str], stdin: bytes | None) -> None:
    roundtrip(connect(Host(name="local")), argv, stdin)


@pytest.mark.slow
@PROPERTY
@given(argv=ARGV, stdin=STDIN)
def test_argv_and_stdin_arrive_byte_exact_through_ssh(ssh_host: Target, argv: list[str], stdin: bytes | None) -> None:
    roundtrip(ssh_host, argv, stdin)


@pytest.mark.slow
@PROPERTY
@given(argv=ARGV, stdin=STDIN)
def test_argv_and_stdin_arrive_byte_exact_through_ssh_and_pct_exec(
    pct_host: Target, argv: list[str], stdin: bytes | None
) -> None:
    assert pct_host.wrap(["x"])[:2] == ["pct", "exec"]
    roundtrip(pct_host, argv, stdin)
