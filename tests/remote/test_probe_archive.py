"""The one-shot probe in a real container (pct stand-in over real sshd) runs from the agent archive, installed on
first use in the container (<workspace>/.agent) and, for its kernel-log half, on the Proxmox host
(~/.cache/dflashctl/agent): a damaged copy is installed again, not run."""

from __future__ import annotations

from harness.envs import PveEnv

from dflashctl.remote import agentcall, agentpack, connect, probe

PY = "python3"


def one_shot(pve: PveEnv) -> dict:
    with connect(pve.host) as target:
        return probe.probe_doc(target, pve.host.workspace, "latest", require_run=False, events=True, xid=True)


def test_the_paired_probe_installs_the_archive_on_both_sides_and_survives_a_damaged_one(pve: PveEnv) -> None:
    with connect(pve.host) as target:
        inside, on_host = agentcall.path(target), agentcall.path(target, on_host=True)
    assert inside == f"{pve.host.workspace}/.agent/{agentpack.sha256()}.pyz"
    pve.exec(["rm", "-f", inside])
    first = one_shot(pve)
    assert first["hostname"] and first["xid"]["error"] is None and first["xid"]["source"], first["xid"]  # host half ran
    assert pve.exec(["test", "-f", inside]).returncode == 0
    installed = pve.exec(["cat", inside]).stdout
    assert installed.endswith(b"\n") is False and installed[-77:-64] == b"dflash-agent "
    pve.exec(["sh", "-c", f"printf garbage > {inside}"])
    second = one_shot(pve)
    assert second["hostname"] == first["hostname"] and second["xid"] == first["xid"]
    assert pve.exec(["cat", inside]).stdout == installed  # installed again, whole
    assert on_host.startswith("~/.cache/dflashctl/agent/")
