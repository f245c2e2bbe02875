"""`--hosts pve1,pve2` (the issue's spelling of a run across hosts) beside `--hosts FILE` (the hosts.toml to use)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.cli.cluster import host_list
from dflashctl.errors import ConfigError


def test_a_value_with_a_comma_lists_hosts():
    assert host_list(Path("pve1,pve2"), None) == (None, "pve1,pve2")


def test_a_file_stays_the_hosts_file(tmp_path: Path):
    plain = tmp_path / "hosts.toml"
    assert host_list(plain, None) == (plain, None)  # no comma: a file, found or not (load_inventory says which)
    odd = tmp_path / "a,b.toml"
    odd.write_text("")
    assert host_list(odd, "pve1") == (odd, "pve1")  # an existing file of that name is still the hosts file
    assert host_list(None, "pve1,pve2") == (None, "pve1,pve2")


def test_a_host_list_in_both_options_is_a_usage_error():
    with pytest.raises(ConfigError, match="both name the hosts to use; give one"):
        host_list(Path("pve1,pve2"), "pve1")


@pytest.mark.parametrize("verb", ["launch", "status", "logs", "stop", "kill-zombies"])
def test_help_names_the_host_list(verb: str):
    env = {**os.environ, "COLUMNS": "220", "TERMINAL_WIDTH": "220", "NO_COLOR": "1"}
    res = subprocess.run([sys.executable, "-m", "dflashctl", verb, "--help"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0 and "FILE|H1,H2" in res.stdout and "(pve1,pve2)" in res.stdout, res.stdout
