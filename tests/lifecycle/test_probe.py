"""The probe: stdlib-only, framed, incremental log reads, liveness checked against the marker."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.agentpyz import archive_path

from dflashctl.agent.lib.frame import SENTINEL, frame
from dflashctl.agent.probe.procs import host_gpu_procs
from dflashctl.analysis.gpus import from_probe
from dflashctl.errors import DflashError, NotFound
from dflashctl.remote.probe import decode_log, parse_frames, probe_doc, stream_docs
from dflashctl.report import parse_report

from .conftest import write_config

pytestmark = pytest.mark.timeout(60)


def make_run(ws: Path, run_id: str, log: bytes = b"", pid: int | None = None) -> Path:
    rd = ws / "runs" / run_id
    rd.mkdir(parents=True)
    (rd / "train.log").write_bytes(log)
    if pid is not None:
        (rd / "pid").write_text(f"{pid}\n")
    latest = ws / "runs" / "latest"
    if latest.is_symlink():
        latest.unlink()
    latest.symlink_to(run_id)
    return rd


def test_the_probe_runs_from_the_archive_on_a_bare_python_without_site_packages(tmp_path):
    make_run(tmp_path, "r1", b"step=1 loss=2\n")
    res = subprocess.run([sys.executable, "-I", "-S", archive_path(), "probe", "--workspace", str(tmp_path), "--run",
                          "latest", "--procs", "--gpus"], capture_output=True, timeout=30)
    assert res.returncode == 0, res.stderr
    (doc,) = parse_frames(res.stdout)
    assert doc["probe_version"] == 1 and doc["run"]["id"] == "r1"
    assert decode_log(doc) == b"step=1 loss=2\n"
    assert doc["gpus"]["source"] is None and "nvidia-smi" in doc["gpus"]["error"]  # no GPU here: said, not raised


def test_frames_survive_banners_and_torn_lines():
    doc = {"probe_version": 1, "time": 1.0, "hostname": "h"}
    text = ("Welcome to Ubuntu 22.04\nperl: warning: Setting locale failed.\n"
            f"{frame(doc)}\n{frame(doc)[:-20]}\n"
            f"motd junk {frame({**doc, 'time': 2.0})}\n")
    assert [d["time"] for d in parse_frames(text)] == [1.0, 2.0]


def test_a_stale_probe_version_is_refused():
    with pytest.raises(DflashError, match="probe version 0"):
        parse_frames(frame({"probe_version": 0}) + "\n")


def test_log_reads_resume_from_an_offset_and_restart_after_rotation(local_host, tmp_path):
    ws = local_host.workspace_dir
    rd = make_run(ws, "r1", b"line1\nline2\n")
    with local_host.connect() as t:
        a = probe_doc(t, str(ws), "r1", log_offset=0, gpus=False)
        assert decode_log(a) == b"line1\nline2\n" and a["log"]["next_offset"] == 12
        with open(rd / "train.log", "ab") as f:
            f.write(b"line3\n")
        b = probe_doc(t, str(ws), "r1", log_offset=12, log_inode=a["log"]["inode"], gpus=False)
        assert decode_log(b) == b"line3\n" and not b["log"]["rotated"]
        (rd / "train.log").write_bytes(b"new\n")  # truncated: smaller than the offset
        c = probe_doc(t, str(ws), "r1", log_offset=18, gpus=False)
        assert c["log"]["rotated"] and decode_log(c) == b"new\n"
        os.rename(rd / "train.log", rd / "train.log.1")  # rotated: a different file, maybe larger
        (rd / "train.log").write_bytes(b"x" * 40)
        d = probe_doc(t, str(ws), "r1", log_offset=4, log_inode=c["log"]["inode"], gpus=False)
        assert d["log"]["rotated"] and d["log"]["offset"] == 0 and decode_log(d) == b"x" * 40
        tail = probe_doc(t, str(ws), "r1", log_max=8, gpus=False)  # no offset: the last log_max bytes
        assert tail["log"]["offset"] == 32 and decode_log(tail) == b"x" * 8


def test_log_record_carries_the_files_mtime(local_host):
    ws = local_host.workspace_dir
    rd = make_run(ws, "r1", b"step=1\n")
    os.utime(rd / "train.log", (1_700_000_000.5, 1_700_000_000.5))
    with local_host.connect() as t:
        doc = probe_doc(t, str(ws), "r1", gpus=False)
    assert doc["log"]["mtime"] == 1_700_000_000.5


def test_stream_given_the_old_inode_rereads_a_log_rotated_between_reconnects(local_host):
    ws = local_host.workspace_dir
    rd = make_run(ws, "r1", b"old1\nold2\n")
    with local_host.connect() as t:
        a = probe_doc(t, str(ws), "r1", log_offset=0, gpus=False)
        os.rename(rd / "train.log", rd / "train.log.1")  # rotated while no probe was watching ...
        (rd / "train.log").write_bytes(b"new file, already longer than the old offset\n")  # ... and grew past it
        stream = stream_docs(t, str(ws), "r1", a["log"]["next_offset"], 0.1, gpus=False,
                              log_inode=a["log"]["inode"])
        try:
            doc = next(stream)
        finally:
            stream.close()
    assert doc["log"]["rotated"] and doc["log"]["offset"] == 0
    assert decode_log(doc) == b"new file, already longer than the old offset\n"


def test_watch_mode_sends_only_new_bytes_each_interval(local_host):
    ws = local_host.workspace_dir
    rd = make_run(ws, "r1", b"")
    got = b""
    with local_host.connect() as t:
        stream = stream_docs(t, str(ws), "r1", 0, 0.1, gpus=False)
        try:
            for i, doc in enumerate(stream):
                got += decode_log(doc)
                if i < 5:
                    with open(rd / "train.log", "ab") as f:
                        f.write(f"step={i}\n".encode())
                elif got.count(b"\n") == 5:
                    break
                assert i < 100
        finally:
            stream.close()
    assert got == (rd / "train.log").read_bytes()


def test_watch_with_a_gpu_interval_sends_every_reading_of_the_interval(local_host):
    """--gpu-interval 0.2 with reports 1.5 s apart: each report carries several readings (up to 7; fewer where a
    slow nvidia-smi call overruns its moment), each one nvidia-smi call (a frame of the stand-in), in order and none
    twice; the last is the report's own `gpus`."""
    ws = local_host.workspace_dir
    make_run(ws, "r1", b"step=1\n")
    local_host.set_gpu_frames([[{"memory.used": 40000 + k, "utilization.gpu": k % 101, "power.draw": 100.0 + k}]
                               for k in range(200)])
    docs = []
    with local_host.connect() as t:
        stream = stream_docs(t, str(ws), "r1", 0, 1.5, gpus=True, gpu_interval=0.2)
        try:
            for doc in stream:
                docs.append(doc)
                if len(docs) == 4:
                    break
        finally:
            stream.close()
    if docs[0]["gpus"]["source"] == "nvml":
        pytest.skip("real NVML present: the scripted nvidia-smi is not what the probe reads here")
    assert len(docs[0]["gpus_series"]) == 1  # the first report: its own reading only
    readings = []
    for doc in docs:
        series = parse_report(doc).gpus_series
        assert series[-1].smi_csv == doc["gpus"]["smi_csv"] and series[-1].time == doc["time"]
        samples = [from_probe(g, g.time)[0][0] for g in series]
        readings.append([int(s.memory_used_mib) - 40000 for s in samples])
        times = [g.time for g in series]
        assert times == sorted(times) and times[-1] - times[0] < 2 * 1.5
    assert sum(readings, []) == list(range(sum(len(r) for r in readings)))  # every frame once, in order
    assert all(len(r) >= 2 for r in readings[1:]) and max(len(r) for r in readings) >= 3, readings


def test_watch_without_a_gpu_interval_sends_one_reading_a_report(local_host):
    make_run(local_host.workspace_dir, "r1", b"")
    local_host.set_gpus([{"memory.used": 88283, "utilization.gpu": 0}])
    with local_host.connect() as t:
        stream = stream_docs(t, str(local_host.workspace_dir), "r1", 0, 0.3, gpus=True)
        try:
            docs = [next(stream), next(stream)]
        finally:
            stream.close()
    assert [len(d["gpus_series"]) for d in docs] == [1, 1]


def test_a_reused_pid_does_not_make_a_dead_run_alive(local_host):
    ws = local_host.workspace_dir
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={"PATH": os.environ["PATH"]})
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={"PATH": os.environ["PATH"], "DFLASH_RUN_ID": "r2"})
    try:
        make_run(ws, "r1", pid=stranger.pid)  # the recorded pid now belongs to someone else
        make_run(ws, "r2", pid=marked.pid)
        with local_host.connect() as t:
            assert probe_doc(t, str(ws), "r1", gpus=False)["run"]["alive"] is False
            doc = probe_doc(t, str(ws), "r2", gpus=False, procs=True)
            assert doc["run"]["alive"] is True
            mine = {p["pid"]: p for p in doc["procs"]}
            assert mine[marked.pid]["run_id"] == "r2" and stranger.pid not in mine
            marked.kill()
            marked.wait()
            assert probe_doc(t, str(ws), "r2", gpus=False)["run"]["alive"] is False
    finally:
        for p in (stranger, marked):
            p.kill()
            p.wait()


def test_a_missing_run_is_not_found(local_host):
    with local_host.connect() as t, pytest.raises(NotFound) as e:
        probe_doc(t, str(local_host.workspace_dir), "nope", gpus=False)
    assert e.value.exit_code == 102


def test_gpus_come_from_the_nvidia_smi_csv_when_nvml_is_absent(local_host):
    local_host.set_gpus([{"memory.used": 88283, "utilization.gpu": 0}, {"memory.used": 512}])
    with local_host.connect() as t:
        doc = probe_doc(t, str(local_host.workspace_dir), gpus=True)
    g = doc["gpus"]
    if g["source"] == "nvml":  # a real driver on this machine: NVML wins, as designed
        pytest.skip("real NVML present: the nvidia-smi fallback is not used here")
    assert g["source"] == "nvidia-smi" and g["error"] is None
    header, *lines = g["smi_csv"].splitlines()  # the CSV crosses with nvidia-smi's header: it names the columns
    assert header.startswith("index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], "
                             "power.draw [W], ")  # then the health columns (agent/probe/gpus.py SMI_HEALTH)
    assert "ecc.errors.uncorrected.volatile.total" in header and g["smi_missing"] == []
    rows = [line.split(", ") for line in lines]
    assert [(r[0], r[3]) for r in rows] == [("0", "88283"), ("1", "512")]


def test_a_broken_driver_is_an_error_field_not_a_crash(local_host):
    local_host.gpus.fail()
    with local_host.connect() as t:
        doc = probe_doc(t, str(local_host.workspace_dir), gpus=True)
    assert doc["gpus"]["source"] is None and "exit 9" in doc["gpus"]["error"]


def test_disk_free_is_reported_for_the_workspace(local_host):
    with local_host.connect() as t:
        doc = probe_doc(t, str(local_host.workspace_dir / "not-yet"), gpus=False)
    assert doc["disk"]["free_mib"] > 0 and doc["disk"]["path"] == str(local_host.workspace_dir)


def test_host_gpu_procs_without_nvidia_smi_are_none_and_no_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert host_gpu_procs("200") == {"csv": None, "procs": [], "error": None}  # a CPU host is not broken


def test_host_gpu_procs_with_a_broken_driver_say_so(local_host):
    local_host.gpus.fail()
    out = host_gpu_procs("200")
    assert out["procs"] == [] and "exit 9" in out["error"]


def test_probe_output_is_one_line_per_report(local_host, tmp_path):
    make_run(local_host.workspace_dir, "r1", base64.b64encode(os.urandom(3000)) + b"\nlast\n")
    write_config(tmp_path / "unused.toml", x=1)
    res = subprocess.run([sys.executable, archive_path(), "probe", "--workspace", str(local_host.workspace_dir),
                          "--run", "r1"], capture_output=True, timeout=30)
    lines = res.stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(SENTINEL + " ")
    assert time.time() - parse_frames(lines[0])[0]["time"] < 600


def test_cutting_a_hung_nvidia_smi_ends_it_and_the_reading_returns_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmiQuery.cut (the sentinel's end, a GPU recheck) kills the call in flight, under its lock."""
    import threading

    from dflashctl.agent.probe.gpus import SmiQuery

    pidfile = tmp_path / "smi.pid"
    smi = tmp_path / "bin" / "nvidia-smi"  # the stand-in: hangs as after an Xid 79
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\necho $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}\nexec sleep 3600\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    query = SmiQuery()
    query.timeout_s = 3600  # only cut() can end the call: its own limit would pass this test without it
    got: list = []
    reading = threading.Thread(target=lambda: got.append(query.run()))
    reading.start()
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pidfile.exists(), "the stand-in nvidia-smi never started"
    pid = int(pidfile.read_text())
    query.cut(0)
    reading.join(60)
    assert not reading.is_alive() and got[0][0] is None and got[0][1] and "timed out" not in got[0][1], got
    assert not Path(f"/proc/{pid}").exists()
    query.cut(0)  # none in flight: nothing to kill, no error
