"""`dflashctl hosts` and `hosts check` end to end: the inventory table/JSON, real checks over the test
sshd + pct stand-in, and every failure as one ERROR line + its exit code + no traceback, through the
installed console script (a real process, real exit status)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.envs import PveEnv, toml_str
from harness.sshd import closed_port

from dflashctl.cli import main

DFLASHCTL = Path(sys.executable).parent / "dflashctl"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(DFLASHCTL), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def assert_one_error(res: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Exactly one ERROR line (plus optional HINT lines) on stderr, the exit code, no traceback."""
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.splitlines()
    errors = [ln for ln in lines if ln.startswith("ERROR: ")]
    assert len(errors) == 1, res.stderr
    assert all(ln.startswith(("ERROR: ", "HINT: ")) for ln in lines), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def pve_toml(pve: PveEnv, **overrides: object) -> Path:
    """A hosts.toml with the pve host, some fields replaced (a None value drops the key)."""
    fields: dict[str, object] = {"transport": "ssh", "address": pve.sshd.address, "port": pve.sshd.port,
                                 "user": "root", "identity_file": str(pve.sshd.client_key), "container": pve.ctid}
    fields.update(overrides)
    flat: dict[str, object] = {}
    for k, v in fields.items():
        if isinstance(v, dict):
            flat.update({f"{k}.{sub}": x for sub, x in v.items()})
        elif v is not None:
            flat[k] = v
    body = "".join(f"{k} = {toml_str(v) if isinstance(v, str) else json.dumps(v)}\n" for k, v in flat.items())
    path = pve.tmp / "variant-hosts.toml"
    path.write_text(f'default = "pve"\n[hosts.pve]\n{body}')
    return path


# -- the inventory ----------------------------------------------------------------------------


def test_hosts_lists_the_inventory_with_the_default_marked(pve: PveEnv, capsys: pytest.CaptureFixture) -> None:
    assert main(["hosts", "--hosts", str(pve.hosts_file)]) == 0
    out = capsys.readouterr().out
    assert "hosts from" in out
    row = next(ln for ln in out.splitlines() if " pve " in ln)
    assert row.startswith("│ * │ pve ") and f"│ {pve.ctid} " in row
    local = next(ln for ln in out.splitlines() if " local " in ln)
    assert local.startswith("│   │ local ") and "this" in local


def test_hosts_json_has_schema_and_every_field(pve: PveEnv, capsys: pytest.CaptureFixture) -> None:
    assert main(["hosts", "--json"]) == 0  # $DFLASHCTL_HOSTS from the fixture
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1 and doc["default"] == "pve" and doc["source"] == str(pve.hosts_file)
    by_name = {h["name"]: h for h in doc["hosts"]}
    assert by_name["pve"]["container"] == pve.ctid and by_name["pve"]["default"] is True
    assert by_name["local"]["transport"] == "local" and by_name["local"]["gpus"] == {"target": [], "drafters": []}


def test_hosts_json_carries_every_key_hosts_toml_can_set(pve: PveEnv, capsys: pytest.CaptureFixture) -> None:
    """What a user's own trainer needs (its command, its tree, its progress format) shows in the JSON too."""
    toml = pve_toml(pve, command=["torchrun", "--nproc-per-node", "2", "train.py"], code_source=str(pve.tmp),
                    progress_regex=r"it (?P<step>\d+) loss (?P<loss>\S+)")
    assert main(["hosts", "--hosts", str(toml), "--json"]) == 0
    [host] = json.loads(capsys.readouterr().out)["hosts"]
    assert host["command"] == ["torchrun", "--nproc-per-node", "2", "train.py"]
    assert host["code_source"] == str(pve.tmp) and host["progress_regex"] == r"it (?P<step>\d+) loss (?P<loss>\S+)"


# -- hosts check, passing ---------------------------------------------------------------------


def test_hosts_check_passes_for_a_ready_container_and_counts_its_gpus(pve: PveEnv, capsys) -> None:
    pve.set_gpus([{"memory.used": 1000}] * 8)
    assert main(["hosts", "check", "pve", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1 and doc["ok"] is True
    checks = {c["name"]: c for c in doc["hosts"][0]["checks"]}
    assert [c["status"] for name, c in checks.items() if name not in ("py-spy", "devices", "driver")] == ["ok"] * 6
    # no NVIDIA driver on the test host: nothing to hold the container's nodes and user space against
    # (tests/cli/test_hosts_check_container.py passes them through)
    assert (checks["devices"]["status"], checks["driver"]["status"]) == ("skip", "skip")
    assert checks["py-spy"]["status"] in ("ok", "warn")  # a warning when the image has no py-spy, never a failure
    assert checks["container"]["detail"] == f"CT {pve.ctid} running"
    assert checks["gpus"]["detail"] == "8 GPUs (NVIDIA H100 80GB HBM3)"
    assert checks["workspace"]["detail"] == "/workspace/dflash writable"
    assert (pve.workspace_dir / "dflash").is_dir()  # created inside the container's /workspace


def test_missing_nvidia_smi_is_a_warning_on_a_cpu_host_and_a_failure_when_gpus_are_configured(
    pve: PveEnv, capsys
) -> None:
    pve.set_gpus(None)
    assert main(["hosts", "check", "pve", "--json"]) == 0
    gpus = next(c for c in json.loads(capsys.readouterr().out)["hosts"][0]["checks"] if c["name"] == "gpus")
    assert gpus == {"name": "gpus", "status": "warn",
                    "detail": "nvidia-smi not found: CPU only (no GPUs listed in hosts.toml)"}
    with_gpus = pve_toml(pve, **{"gpus": {"target": [0], "drafters": [1]}})
    assert main(["hosts", "check", "--hosts", str(with_gpus)]) == 2
    captured = capsys.readouterr()
    assert "nvidia-smi not found, but hosts.toml uses GPUs [0, 1]" in captured.err


def test_persistence_mode_off_is_a_warning_naming_the_gpus_and_the_fix(pve: PveEnv, capsys) -> None:
    pve.set_gpus([{"persistence_mode": "Enabled"}, {"persistence_mode": "Disabled"}, {"persistence_mode": "Disabled"}])
    assert main(["hosts", "check", "pve", "--json"]) == 0  # a warning, never a failure
    gpus = next(c for c in json.loads(capsys.readouterr().out)["hosts"][0]["checks"] if c["name"] == "gpus")
    assert gpus["status"] == "warn"
    assert gpus["detail"] == ("3 GPUs (NVIDIA H100 80GB HBM3); persistence mode off on GPU 1,2 "
                              "(on the host: nvidia-smi -pm 1, or enable nvidia-persistenced)")


def test_too_few_gpus_for_the_configured_indices_fails(pve: PveEnv, capsys) -> None:
    pve.set_gpus([{}, {}])
    with_gpus = pve_toml(pve, **{"gpus": {"target": [0, 1], "drafters": [2]}})
    assert main(["hosts", "check", "--hosts", str(with_gpus)]) == 2
    assert "2 GPUs (NVIDIA H100 80GB HBM3), but hosts.toml uses GPU 2" in capsys.readouterr().err


def test_hosts_check_runs_hosts_concurrently(pve: PveEnv, capsys) -> None:
    """Each host's nvidia-smi waits until the other one is running too: sequential checks would
    time the first one out (exit 9 -> a gpus failure), concurrent ones both pass."""
    pve.set_gpus([{}])
    pve.gpus.extra(rendezvous={"dir": str(pve.tmp / "rendezvous"), "count": 2, "timeout": 20})
    two = pve.tmp / "two-hosts.toml"
    table = pve.hosts_file.read_text().split("[hosts.local]")[0]
    two.write_text(table + table.split('default = "pve"\n')[1].replace("[hosts.pve]", "[hosts.pve-b]"))
    assert main(["hosts", "check", "--hosts", str(two), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [h["name"] for h in doc["hosts"]] == ["pve", "pve-b"]
    assert all(c["status"] == "ok" for h in doc["hosts"] for c in h["checks"]
               if c["name"] not in ("py-spy", "devices", "driver"))  # no NVIDIA driver on the test host: skips


def test_hosts_check_says_whether_py_spy_is_there_and_warns_when_it_is_not(local_host, capsys, tmp_path,
                                                                          monkeypatch) -> None:
    from harness.pyspy import py_spy_binary, without_py_spy

    monkeypatch.setenv("PATH", without_py_spy(os.environ["PATH"]))
    assert main(["hosts", "check", "local", "--json"]) == 0  # a warning passes
    spy = next(c for c in json.loads(capsys.readouterr().out)["hosts"][0]["checks"] if c["name"] == "py-spy")
    assert spy["status"] == "warn" and "pip install py-spy" in spy["detail"]
    binary, why = py_spy_binary(tmp_path / "py-spy")
    if binary is None:
        pytest.skip(why)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ['PATH']}")
    assert main(["hosts", "check", "local", "--json"]) == 0
    spy = next(c for c in json.loads(capsys.readouterr().out)["hosts"][0]["checks"] if c["name"] == "py-spy")
    assert spy["status"] == "ok" and spy["detail"].startswith("py-spy ") and str(binary) in spy["detail"]


def test_hosts_check_of_the_local_host(local_host, capsys) -> None:
    local_host.set_gpus([{}, {}])
    assert main(["hosts", "check", "local"]) == 0
    out = capsys.readouterr().out
    assert "this machine" in out and "2 GPUs" in out and "1/1 host ready" in out


# -- every failure: one line, its exit code, no traceback (through the console script) ----------


def test_malformed_toml(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.toml"
    bad.write_text('[hosts.pve]\naddress = "pve1.example.invalid\n')
    assert_one_error(cli("hosts", "--hosts", str(bad)), 2, str(bad), "invalid TOML", "line 2")


def test_unknown_key(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.toml"
    bad.write_text('[hosts.pve]\naddress = "pve1.example.invalid"\ncontainr = 200\n')
    assert_one_error(cli("hosts", "check", "--hosts", str(bad)), 2, f"{bad}:3: [hosts.pve] containr: unknown key")


def test_unknown_host(pve: PveEnv) -> None:
    assert_one_error(cli("hosts", "check", "pve2"), 2, "unknown host 'pve2'", "known: pve, local")


def test_connection_refused(pve: PveEnv) -> None:
    f = pve_toml(pve, port=closed_port())
    assert_one_error(cli("hosts", "check", "--hosts", str(f)), 102, "connection refused")


def test_authentication_failure(pve: PveEnv) -> None:
    key = pve.tmp / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    f = pve_toml(pve, identity_file=str(key))
    assert_one_error(cli("hosts", "check", "--hosts", str(f)), 2, "authentication failed")


def test_host_key_mismatch(pve: PveEnv) -> None:
    key = pve.tmp / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kind, blob = key.with_suffix(".pub").read_text().split()[:2]
    kh = pve.tmp / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{pve.sshd.port} {kind} {blob}\n")
    res = cli("hosts", "check", env={"DFLASHCTL_KNOWN_HOSTS": str(kh)})
    assert_one_error(res, 2, "host key does not match")
    assert "ssh-keygen" in res.stderr  # the hint says how to fix it


def test_container_stopped(pve: PveEnv) -> None:
    pve.stop_container()
    res = cli("hosts", "check", "pve")
    assert_one_error(res, 102, f"container {pve.ctid} is not running")
    assert f"pct start {pve.ctid}" in res.stderr


def test_command_timeout(pve: PveEnv) -> None:
    pve.set_gpus([{}])
    pve.gpus.extra(sleep=30)  # nvidia-smi hangs, like on a wedged GPU
    assert_one_error(cli("hosts", "check", "pve", "--timeout", "2"), 101, "timed out after 2s")


def test_hosts_option_given_before_check_applies_to_check(pve: PveEnv, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(tmp_path / "absent.toml"))  # would be an error if used
    assert main(["hosts", "--hosts", str(pve.hosts_file), "check", "pve", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hosts"][0]["name"] == "pve"
