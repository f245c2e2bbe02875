"""`--hosts` means one thing, the hosts.toml to use (issue 25); a run across hosts is `--host pve1,pve2` or
`--cluster NAME`. A value with a comma is a file name like any other, never read as a host list."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.cli import main


def test_a_hosts_value_with_a_comma_is_a_missing_file_not_a_host_list(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--hosts", "pve1,pve2", "--json"]) == 2
    err = capsys.readouterr().err
    assert "hosts file pve1,pve2 (from --hosts) does not exist" in err and "Traceback" not in err


def test_a_file_whose_name_has_a_comma_is_the_hosts_file(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    odd = tmp_path / "a,b.toml"
    odd.write_text('default = "here"\n[hosts.here]\ntransport = "local"\nworkspace = "ws"\n')
    assert main(["runs", "--hosts", str(odd), "--json"]) == 0
    assert '"runs": []' in capsys.readouterr().out


@pytest.mark.parametrize("verb", ["launch", "status", "logs", "stop", "kill-zombies"])
def test_help_says_hosts_is_a_file_and_host_takes_a_list(verb: str):
    env = {**os.environ, "COLUMNS": "220", "TERMINAL_WIDTH": "220", "NO_COLOR": "1"}
    res = subprocess.run([sys.executable, "-m", "dflashctl", verb, "--help"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "--hosts" in res.stdout and "FILE" in res.stdout and "H1,H2" not in res.stdout, res.stdout
