"""The harness's stand-ins behave like the real tools where dflashctl depends on it: `pct`'s argv,
output and exit codes; `nvidia-smi`'s CSV formats. (The end-to-end tests are only as good as these.)"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from harness.envs import PveEnv


def test_pct_exec_passes_argv_without_a_shell_forwards_stdin_and_returns_the_exit_status(pve: PveEnv) -> None:
    res = pve.exec(["sh", "-c", 'cat; echo "$1"; exit 42', "sh", "$HOME `id` ; |"], stdin=b"in\n")
    assert (res.returncode, res.stdout) == (42, b"in\n$HOME `id` ; |\n")


def test_pct_exec_runs_in_the_container_namespaces_with_workspace_bound(pve: PveEnv) -> None:
    (pve.workspace_dir / "marker").write_text("here")
    res = pve.exec(["sh", "-c", "cat /workspace/marker; echo; cat /proc/1/cmdline | tr '\\0' ' '; echo; echo $$"])
    marker, init, pid = res.stdout.decode().splitlines()
    assert marker == "here" and int(pid) > 1
    # real LXC: init.lxc is PID 1 (argv[0] "init"); the namespace stand-in's is ctinit.py
    assert init.startswith("init ") if pve.sshd.pct_backend == "lxc" else "ctinit.py" in init
    assert pve.init_pid != int(pid) and Path(f"/proc/{pve.init_pid}").exists()


def _env_in_ct(pve: PveEnv, *opts: str, env: dict[str, str]) -> dict[str, str]:
    res = subprocess.run(["pct", "exec", str(pve.ctid), *opts, "--", "env", "-0"], capture_output=True, timeout=60,
                         env={**os.environ, **pve.sshd.env, **env})
    assert res.returncode == 0, res.stderr
    return dict(kv.split("=", 1) for kv in res.stdout.decode().split("\0") if kv)


def test_pct_exec_keeps_the_callers_environment_by_default_and_clears_it_with_keep_env_0(pve: PveEnv) -> None:
    """pve-container's pct.pm: keep-env defaults to 1 (lxc-attach --keep-env), SSL_CERT_FILE / SSL_CERT_DIR are
    deleted first; the PATH a kept environment carries is the one PVE's CLI handler set, unless the CT configures
    one (lxc.environment applies on top); --keep-env 0: lxc-attach --clear-env."""
    caller = {"LANG": "C.UTF-8", "SSL_CERT_FILE": "/x.pem", "SSL_CERT_DIR": "/x", "DFLASH_TEST_VAR": "kept"}
    kept = _env_in_ct(pve, env=caller)
    assert kept["DFLASH_TEST_VAR"] == "kept" and kept["LANG"] == "C.UTF-8" and kept["container"] == "lxc"
    assert "SSL_CERT_FILE" not in kept and "SSL_CERT_DIR" not in kept
    assert kept["PATH"] == pve.environment("PATH") and kept["DFLASH_FAKE_GPUS"] == str(pve.sshd.gpu_scenario)
    assert _env_in_ct(pve, "--keep-env", "1", env=caller) == kept
    cleared = _env_in_ct(pve, "--keep-env", "0", env=caller)
    assert "DFLASH_TEST_VAR" not in cleared and "LANG" not in cleared and "PCT_STATE" not in cleared
    assert cleared["container"] == "lxc" and cleared["PATH"] == pve.environment("PATH")
    if pve.sshd.pct_backend == "lxc":
        assert cleared["TERM"] == "linux"  # PVE's generated config: lxc.environment = TERM=linux
    pve.set_environment("PATH", "/usr/bin:/bin")  # no PATH configured: the CLI handler's reaches the CT
    pve.conf.write_text("".join(f"{ln}\n" for ln in pve.conf.read_text().splitlines()
                                if not ln.startswith("lxc.environment: PATH=")))
    if pve.sshd.lxcpath is not None:
        live = pve.sshd.lxcpath / str(pve.ctid) / "config"
        live.write_text("".join(f"{ln}\n" for ln in live.read_text().splitlines()
                                if not ln.startswith("lxc.environment = PATH=")))
    assert _env_in_ct(pve, env=caller)["PATH"] == "/sbin:/bin:/usr/sbin:/usr/bin"


@pytest.mark.both_env_modes
def test_the_pve_fixture_runs_pct_exec_in_the_mode_it_was_given(pve: PveEnv, pct_env_mode: str) -> None:
    env = _env_in_ct(pve, env={"DFLASH_TEST_VAR": "x"})
    assert ("DFLASH_TEST_VAR" in env) == (pct_env_mode == "keep-env")


def test_pct_exec_bad_keep_env_value_and_missing_command(pve: PveEnv) -> None:
    ct = str(pve.ctid)
    missing = pve.pct("exec", ct, "--")
    assert missing.returncode == 255 and missing.stderr.startswith(b"missing command")
    if pve.sshd.pct_backend == "lxc":
        bad = pve.pct("exec", ct, "--keep-env", "maybe", "--", "true")
        assert bad.returncode == 255 and b"keep-env: type check ('boolean') failed - got 'maybe'" in bad.stderr


def test_pct_status_start_stop_and_their_refusals(pve: PveEnv) -> None:
    ct = str(pve.ctid)
    assert pve.pct("status", ct).stdout == b"status: running\n"
    again = pve.pct("start", ct)
    assert (again.returncode, again.stderr) == (255, f"CT {ct} already running\n".encode())
    assert pve.pct("stop", ct).returncode == 0
    assert pve.pct("status", ct).stdout == b"status: stopped\n"
    res = pve.pct("stop", ct)
    assert (res.returncode, res.stderr) == (255, f"CT {ct} not running\n".encode())
    for opts in ((), ("--keep-env", "0")):  # pct.pm's exec: die "container '$vmid' not running!\n"
        res = pve.pct("exec", ct, *opts, "--", "true")
        assert (res.returncode, res.stderr) == (255, f"container '{ct}' not running!\n".encode())
    assert pve.pct("start", ct).returncode == 0
    assert pve.pct("status", ct).stdout == b"status: running\n"


def test_pct_unknown_ctid_fails_with_the_proxmox_message_and_exit_2(pve: PveEnv) -> None:
    for verb in ("status", "start", "stop", "exec"):
        res = pve.pct(verb, "987")
        assert res.returncode == 2
        assert res.stderr.decode().startswith("Configuration file 'nodes/")
        assert res.stderr.decode().endswith("/lxc/987.conf' does not exist\n")


def test_pct_stop_ends_every_process_of_the_container(pve: PveEnv) -> None:
    pve.exec(["sh", "-c", "setsid -f sleep 120 </dev/null >/dev/null 2>&1"])
    assert pve.exec(["pgrep", "-fx", "sleep 120"]).returncode == 0
    pve.stop_container()
    pve.start_container()
    assert pve.exec(["pgrep", "-fx", "sleep 120"]).returncode == 1


def test_pct_push_and_pull_copy_files_in_and_out(pve: PveEnv) -> None:
    src = pve.tmp / "src.bin"
    src.write_bytes(bytes(range(256)))
    assert pve.pct("push", str(pve.ctid), str(src), "/workspace/pushed.bin", "--perms", "600").returncode == 0
    assert (pve.workspace_dir / "pushed.bin").read_bytes() == bytes(range(256))
    assert oct((pve.workspace_dir / "pushed.bin").stat().st_mode & 0o777) == "0o600"
    out = pve.tmp / "pulled.bin"
    assert pve.pct("pull", str(pve.ctid), "/workspace/pushed.bin", str(out)).returncode == 0
    assert out.read_bytes() == bytes(range(256))
    missing = pve.pct("pull", str(pve.ctid), "/workspace/nope", str(out))
    assert missing.returncode == 255 and b"No such file" in missing.stderr


def test_nvidia_smi_prints_query_gpu_csv_like_the_real_tool(pve: PveEnv) -> None:
    pve.set_gpus([{"memory.used": 88283, "utilization.gpu": 0, "power.draw": 120.5},
                  {"memory.used": 46901, "utilization.gpu": 97}])
    q = "--query-gpu=index,memory.used,utilization.gpu,power.draw"
    assert pve.exec(["nvidia-smi", q, "--format=csv"]).stdout.decode() == (
        "index, memory.used [MiB], utilization.gpu [%], power.draw [W]\n"
        "0, 88283 MiB, 0 %, 120.50 W\n"
        "1, 46901 MiB, 97 %, 70.00 W\n")
    assert pve.exec(["nvidia-smi", q, "--format=csv,noheader,nounits"]).stdout.decode() == (
        "0, 88283, 0, 120.50\n1, 46901, 97, 70.00\n")
    listing = pve.exec(["nvidia-smi", "-L"]).stdout.decode().splitlines()
    assert listing[0] == "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-4000-8000-000000000000)"


def test_nvidia_smi_lists_compute_apps_on_the_host_but_not_inside_the_container(pve: PveEnv) -> None:
    pve.set_gpus([{}], processes=[{"pid": 91451, "used_memory": 88000, "gpu": 0}])
    q = ["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv"]
    host = subprocess.run(q, capture_output=True, env={**os.environ, **pve.sshd.env}).stdout.decode()  # host side
    assert host == ("pid, used_gpu_memory [MiB], gpu_uuid\n"
                    "91451, 88000 MiB, GPU-00000000-0000-4000-8000-000000000000\n")
    assert pve.exec(q).stdout.decode() == "pid, used_gpu_memory [MiB], gpu_uuid\n"


def test_nvidia_smi_frames_advance_per_query_and_the_last_repeats(pve: PveEnv) -> None:
    pve.set_gpu_frames([[{"utilization.gpu": 90}], [{"utilization.gpu": 0}]])
    q = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
    assert [pve.exec(q).stdout for _ in range(3)] == [b"90\n", b"0\n", b"0\n"]


def test_nvidia_smi_absent_no_devices_and_broken_driver(pve: PveEnv) -> None:
    pve.set_gpus(None)
    assert pve.exec(["nvidia-smi", "-L"]).returncode != 0
    assert pve.exec(["sh", "-c", "command -v nvidia-smi"]).returncode != 0
    pve.set_gpus([])
    res = pve.exec(["nvidia-smi", "--query-gpu=index", "--format=csv"])
    assert (res.returncode, res.stdout) == (6, b"No devices were found\n")
    pve.gpus.fail()
    res = pve.exec(["nvidia-smi"])
    assert res.returncode == 9 and res.stdout.startswith(b"NVIDIA-SMI has failed")
    bad = pve.exec(["nvidia-smi", "--query-gpu=bogus", "--format=csv"])
    assert bad.returncode == 9  # still "failed driver" first, as the real tool checks the driver first
    pve.set_gpus([{}])
    bad = pve.exec(["nvidia-smi", "--query-gpu=bogus", "--format=csv"])
    assert (bad.returncode, bad.stderr) == (2, b'Field "bogus" is not a valid field to query.\n\n')


def test_without_sshd_the_harness_gives_a_reason_to_skip(monkeypatch) -> None:
    from harness import sshd

    monkeypatch.setattr(sshd, "SSHD", "/nonexistent/sshd")
    assert "openssh-server" in sshd.why_sshd_cannot_run()


def test_container_processes_sit_in_cgroup_lxc_ctid_like_on_proxmox(pve: PveEnv) -> None:
    if pve.container_cgroup is None:
        pytest.skip("no writable cgroup v2 hierarchy here: the harness cannot emulate lxc/<CTID> cgroups")
    res = pve.exec(["sh", "-c", "setsid -f sleep 60 </dev/null >/dev/null 2>&1; sleep 0.1; pgrep -x sleep"])
    inner_pid = res.stdout.split()[0]
    host_pids = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _read(p / "comm") == "sleep\n"]
    matches = [p for p in host_pids if _nspid(p)[-1:] == [inner_pid.decode()]]
    assert matches, "the container's sleep is visible from the host"
    # another worker's container may have a sleep with the same pid in its own namespace: ours is the one in ours
    # Proxmox's layout (lxc.cgroup.dir.container = lxc/<CTID>, .inner = ns): /lxc/<CTID>/ns[/…] with real LXC
    assert any(re.search(rf"^0::{re.escape(pve.container_cgroup)}(/|$)", _read(p / "cgroup"), re.M) for p in matches), \
        [_read(p / "cgroup") for p in matches]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _nspid(proc: Path) -> list[str]:
    for line in _read(proc / "status").splitlines():
        if line.startswith("NSpid:"):
            return line.split()[1:]
    return []


def test_the_container_has_a_loopback_that_is_up_and_resolves_its_hostname(pve: PveEnv) -> None:
    """As a Proxmox CT's own init does: `lo` up (torchrun's TCPStore on localhost), its hostname in /etc/hosts."""
    script = ("import socket\ns = socket.create_server(('localhost', 0))\n"
              "c = socket.create_connection(('localhost', s.getsockname()[1]))\n"
              "print(socket.gethostbyname(socket.gethostname()))")
    res = pve.exec(["python3", "-c", script])
    assert res.returncode == 0, res.stderr
    if pve.sshd.pct_backend == "lxc":
        assert res.stdout == b"127.0.1.1\n"
