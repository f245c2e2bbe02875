"""What one-shot commands pay before and around their one useful round trip (benchmarks/status_latency.py
measures the seconds; these tests pin the causes: round trips and imports, counted, never timed)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from harness.envs import PveEnv
from harness.poll import wait_until

from dflashctl.commands.status import status_once
from dflashctl.errors import ContainerNotRunning, NotFound
from dflashctl.remote import Target, agentcall, connect, probe
from dflashctl.remote.transport import Result, Transport


class Recording(Transport):
    """The real transport, with every command it is given written down (argv[:2] is enough here)."""

    def __init__(self, inner: Transport):
        self.inner = inner
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> Result:
        self.calls.append(list(argv))
        return self.inner.run(argv, stdin=stdin, timeout=timeout)

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Iterator[bytes]:
        self.calls.append(list(argv))
        return self.inner.stream(argv, stdin=stdin)

    def close(self) -> None:
        self.inner.close()


def installed(pve: PveEnv) -> None:
    """The agent archive in the container and on the host, as after a first command (which sends it once)."""
    with connect(pve.host) as target:
        agentcall.install(target)
        agentcall.install(target, on_host=True)


def recorded(host) -> tuple[Target, Recording]:  # noqa: ANN001 - Host
    target = connect(host)
    rec = Recording(target.transport)
    return Target(host, rec), rec


def test_the_first_command_in_a_running_container_is_one_round_trip(pve: PveEnv) -> None:
    target, rec = recorded(pve.host)
    with target:
        assert target.run(["echo", "hi"]).out == "hi\n"
        assert target.run(["sh", "-c", "exit 3"]).exit_code == 3  # its own failure, container known to run
    assert [c[:2] for c in rec.calls] == [["pct", "exec"], ["pct", "exec"]]  # no `pct status` first


def test_a_first_command_that_fails_asks_pct_status_and_keeps_its_own_result(pve: PveEnv) -> None:
    target, rec = recorded(pve.host)
    with target:
        assert target.run(["sh", "-c", "echo out; exit 4"]).out == "out\n"
    assert [c[:2] for c in rec.calls] == [["pct", "exec"], ["pct", "status"]]


def test_a_stopped_or_unknown_container_still_gives_the_precise_one_line_error(pve: PveEnv) -> None:
    pve.stop_container()
    target, _ = recorded(pve.host)
    with target, pytest.raises(ContainerNotRunning) as exc:
        target.run(["true"])
    assert exc.value.message == f"host pve: container {pve.ctid} is not running (status: stopped)"
    target, _ = recorded(replace(pve.host, container=999))
    with target, pytest.raises(NotFound, match="999.conf"):
        target.run(["true"])


XID_79 = ("[Tue Dec  1 16:20:11 2026] NVRM: Xid (PCI:0000:1e:00): 79, pid=4242, name=python3, "
          "GPU has fallen off the bus.")


def test_one_shot_status_of_a_container_host_reads_the_run_and_the_hosts_side_in_two_commands_at_once(
        pve: PveEnv) -> None:
    pve.set_kernel_log([XID_79])
    installed(pve)
    target, rec = recorded(pve.host)
    with target:
        doc = probe.probe_doc(target, pve.host.workspace, "latest", require_run=False, events=True, xid=True)
        with pytest.raises(NotFound, match="no run"):
            status_once(target)
    # each: the container's probe and the host's half, sent together (their order is the threads'); status's host
    # half reads the kernel log and the GPUs' compute apps (its GPU share) in ONE interpreter (agent/hostpair.py)
    wait_until(lambda: len(rec.calls) == 4, what="two requests each")
    assert sorted(c[:2] for c in rec.calls) == [["pct", "exec"]] * 2 + [["python3", "-c"]] * 2
    assert sorted(c[4:] for c in rec.calls if c[0] == "python3") == [["hostpair"], ["hostpair", "--apps"]]
    assert doc["hostname"] and doc["run"] is None  # the container probe's own report
    assert doc["xid"]["lines"] and "Xid (PCI:0000:1e:00): 79" in doc["xid"]["lines"][0]


def test_one_shot_status_of_a_stopped_container_still_gives_the_precise_one_line_error(pve: PveEnv) -> None:
    installed(pve)
    pve.stop_container()
    target, rec = recorded(pve.host)
    with target, pytest.raises(ContainerNotRunning) as exc:
        status_once(target)
    assert exc.value.message == f"host pve: container {pve.ctid} is not running (status: stopped)"
    wait_until(lambda: len(rec.calls) == 3, what="the probe, its pct status and the host half")
    calls = [c[:2] for c in rec.calls]
    assert sorted(calls) == [["pct", "exec"], ["pct", "status"], ["python3", "-c"]]
    assert calls.index(["pct", "status"]) > calls.index(["pct", "exec"])  # asked only once the probe failed


def _imports_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return set(out.split())


def test_importing_the_ssh_transport_leaves_invoke_out() -> None:
    mods = _imports_after("import dflashctl.remote.ssh")
    assert "paramiko" in mods and "invoke" not in mods


def test_match_exec_in_ssh_config_still_runs_its_command(tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text('Match exec "true"\n    User fromexec\nMatch exec "false"\n    Port 2222\nHost *\n    Port 22\n')
    code = (f"import os; os.environ['DFLASHCTL_SSH_CONFIG'] = {str(cfg)!r}\n"
            "from dflashctl.remote.ssh import load_ssh_config\n"
            "o = load_ssh_config().lookup('box.example.invalid'); print(o.get('user'), o.get('port'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["fromexec", "22"], out.stderr
