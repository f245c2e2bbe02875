"""The one-shot probe in a real container (pct stand-in over real sshd) runs from the container's compiled-code
cache (agent/codecache.py, sent beside the host's kernel-log half): the first call writes the entry, a corrupt one is
compiled anew."""

from __future__ import annotations

import hashlib
import sys

from harness.envs import PveEnv

from dflashctl.remote import connect, probe

PY = "python3"
FIND = ("import hashlib, os, sys; from pathlib import Path; src = sys.stdin.buffer.read(); "
        "key = hashlib.sha256(src).hexdigest() + '.' + sys.implementation.cache_tag; "
        "base = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'); "
        "print(os.path.join(base, 'dflashctl', 'code', key) if base.startswith('/') "
        "else f'/tmp/dflashctl-code-{os.getuid()}/{key}')")


def one_shot(pve: PveEnv) -> dict:
    with connect(pve.host) as target:
        return probe.probe_doc(target, pve.host.workspace, "latest", require_run=False, events=True, xid=True)


def test_the_paired_probe_writes_its_cache_entry_and_survives_a_corrupt_one(pve: PveEnv) -> None:
    src = probe.build_script().encode()
    path = pve.exec([PY, "-c", FIND], stdin=src).stdout.decode().strip()
    assert path.endswith(f"{hashlib.sha256(src).hexdigest()}.{sys.implementation.cache_tag}")
    pve.exec(["rm", "-f", path])
    first = one_shot(pve)
    assert first["hostname"] and "xid" in first
    entry = pve.exec(["cat", path]).stdout
    assert entry.startswith(b"dflash-code-1\n")
    pve.exec(["sh", "-c", f"printf garbage > {path}"])
    second = one_shot(pve)
    assert second["hostname"] == first["hostname"] and second["xid"] == first["xid"]
    assert pve.exec(["cat", path]).stdout == entry  # compiled again and rewritten whole
