"""[clusters.NAME] in hosts.toml and the host lists of `--host a,b`: parsed and checked before anything is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashctl.commands.cluster import rendezvous_address, resolve, torchrun_args
from dflashctl.config import parse_inventory
from dflashctl.errors import ConfigError, ExitCode
from dflashctl.model import Cluster

HOSTS = """
[hosts.pve1]
address = "pve1.example.invalid"
container = 200
node_address = "pve1-ct.example.invalid"

[hosts.pve2]
address = "pve2.example.invalid"
container = 200
"""


def inv(extra: str = ""):
    return parse_inventory(HOSTS + extra, Path("/tmp/hosts.toml"))


def test_a_cluster_table_names_its_hosts_port_and_processes():
    i = inv('[clusters.duo]\nhosts = ["pve1", "pve2"]\nrendezvous_port = 29600\nnproc_per_node = 8\n')
    assert i.clusters == {"duo": Cluster("duo", ("pve1", "pve2"), 29600, 8)}
    assert i.hosts["pve1"].node_address == "pve1-ct.example.invalid" and i.hosts["pve2"].node_address is None
    assert resolve(i, None, "duo") == i.clusters["duo"]
    assert resolve(i, None, "duo", rendezvous_port=29700).rendezvous_port == 29700
    assert rendezvous_address(i.hosts["pve1"]) == "pve1-ct.example.invalid"  # how the other nodes reach the first one
    assert rendezvous_address(i.hosts["pve2"]) == "pve2.example.invalid"  # default: the host's address
    assert torchrun_args(i.clusters["duo"], 1, "pve1-ct.example.invalid") == [
        "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "8",
        "--master-addr", "pve1-ct.example.invalid", "--master-port", "29600"]


def test_a_host_list_is_a_cluster_with_the_defaults():
    i = inv()
    assert resolve(i, "pve2,pve1", None) == Cluster("pve2,pve1", ("pve2", "pve1"), 29500, 1)
    assert resolve(i, "pve1", None) is None  # one host: an ordinary launch
    assert resolve(i, None, None) is None


@pytest.mark.parametrize(("table", "expected"), [
    ('[clusters.duo]\nhosts = ["pve1", "nope"]\n', "[clusters.duo] hosts: names host 'nope', which is not defined"),
    ('[clusters.duo]\nhosts = []\n', "hosts: must be an array of distinct host names"),
    ('[clusters.duo]\nhosts = ["pve1", "pve1"]\n', "hosts: must be an array of distinct host names"),
    ('[clusters.duo]\nhosts = ["pve1"]\nrendezvous_port = 70000\n', "rendezvous_port (1-65535)"),
    ('[clusters.duo]\nhosts = ["pve1"]\nnproc_per_node = 0\n', "nproc_per_node (1 or more)"),
    ('[clusters.duo]\nhosts = ["pve1"]\nmaster = "x"\n', "master: unknown key"),
    ("clusters = 3\n", "must be a table [clusters.NAME]"),
])
def test_a_bad_cluster_table_is_one_line_naming_file_and_table(table, expected):
    text = table if table.startswith("clusters") else HOSTS + table
    with pytest.raises(ConfigError) as e:
        parse_inventory(text, Path("/tmp/hosts.toml"))
    assert expected in e.value.message and e.value.message.startswith("/tmp/hosts.toml: ")
    assert "\n" not in e.value.message and e.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(("host", "cluster", "expected"), [
    ("pve1,nope", None, "unknown host 'nope'"),
    ("pve1,,pve2", None, "give distinct host names"),
    ("pve1,pve1", None, "give distinct host names"),
    (None, "trio", "unknown cluster 'trio'"),
    ("pve1", "duo", "--cluster and --host both"),
])
def test_a_bad_host_list_or_cluster_name_is_a_usage_error(host, cluster, expected):
    i = inv('[clusters.duo]\nhosts = ["pve1", "pve2"]\n')
    with pytest.raises(ConfigError) as e:
        resolve(i, host, cluster)
    assert expected in e.value.message and e.value.exit_code == ExitCode.USAGE
