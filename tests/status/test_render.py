"""Golden output of the one renderer that one-shot status, --watch and diagnose share (plain text, no ANSI)."""

from __future__ import annotations

import base64
import io

from rich.console import Console

from dflashctl.cli.status import render_view
from dflashctl.commands.status import Watcher
from dflashctl.report import parse_report

NO_SMI = ("no GPUs visible: nvidia-smi not found "
          "(NVMLError_LibraryNotFound: NVML Shared Library Not Found)")
SMI_BUSY = "0, GPU-00000000-0000-4000-8000-000000000000, NVIDIA H200, 88283, 143771, 97, 650.00\n"
CRASH = (b"Exception in thread drafter-0:\nTraceback (most recent call last):\n"
         b'  File "/ws/code/trainer/drafter.py", line 88, in run\n    self.step()\n'
         b"RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function.\n")


def report(t: float, data: bytes, *, alive: bool = True, exit_code: int | None = None, smi: str | None = None,
           gpu_error: str | None = None) -> dict:
    return {
        "probe_version": 1, "time": t, "hostname": "ct",
        "run": {"id": "20261129-102659-demo", "dir": "/ws/runs/x", "meta": {"started_at_epoch": t - 95.0},
                "pid": 2911, "alive": alive, "exit_code": exit_code, "stopped": False, "heartbeat": None,
                "errors": {}},
        "log": {"path": "/ws/runs/x/train.log", "size": len(data), "inode": 7, "offset": 0, "mtime": t - 3.0,
                "next_offset": len(data), "data_b64": base64.b64encode(data).decode(), "rotated": False},
        "gpus": {"source": "nvidia-smi" if smi else None, "nvml": [], "smi_csv": smi, "error": gpu_error},
    }


def text(doc: dict, *, history: bool = False) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None, force_terminal=False).print(
        render_view(Watcher("local", live=True).update(parse_report(doc)), history=history))
    return out.getvalue()


STEPS = b"".join(b"step=%d loss=4.766 tok/s=19410.5 acc_len=1.21\n" % i for i in range(1, 71))


def test_live_cpu_run_one_line_header_no_exit_code_and_a_short_gpu_line() -> None:
    assert text(report(1000.0, STEPS, gpu_error=NO_SMI)) == (
        "local · run 20261129-102659-demo  TRAINING  pid 2911 · up 1m35s · last log 3s ago · step 70 · "
        "19410.5 tok/s · loss 4.766 · τ 1.21\n"
        "  why: last new step 3 s ago\n"
        "GPUs: none (CPU host: nvidia-smi not found)\n"
    )


def test_the_nvml_detail_stays_in_json() -> None:
    v = Watcher("local").update(parse_report(report(1000.0, STEPS, gpu_error=NO_SMI)))
    assert v.to_record()["gpu_error"] == NO_SMI


def test_an_ended_run_shows_how_its_process_exited() -> None:
    got = text(report(1000.0, STEPS + CRASH, alive=False, exit_code=1, smi=SMI_BUSY))
    assert got.splitlines()[0] == (
        "local · run 20261129-102659-demo  CRASHED (exited 1)  pid 2911 · last log 3s ago · step 70 · "
        "19410.5 tok/s · loss 4.766 · τ 1.21")
    lines = got.splitlines()
    assert lines[1].startswith("cause: compile-thread-race") and lines[2] == "in: drafter-0"  # the cause first
    why = lines.index("  why: exited with code 1; crashed workers: drafter-0")
    assert any(ln.startswith("  | RuntimeError: Detected that") for ln in lines[3:why])  # its traceback's tail
    assert any(ln.startswith("what to do: Set `compile_strategy") for ln in lines[3:why])
    assert lines[why + 1] == "       GPU(s) 0 hold memory that belongs to no live run"
    assert "GPUs:" not in got  # readings came: the table, no note


def test_watch_view_is_the_same_renderer_plus_history() -> None:
    doc = report(1000.0, STEPS, smi=SMI_BUSY)
    one_shot, watched = text(doc), text(doc, history=True)
    assert one_shot.splitlines()[:2] == watched.splitlines()[:2]
    assert "utilisation history" in watched and "utilisation history" not in one_shot


def test_the_last_periodic_evaluation_shows_beside_the_training_step_and_never_replaces_it() -> None:
    log = STEPS + b"eval step=70 acc_len=6.812 tokens_per_forward=6.1 block_size=16 lossless=4/4\n" \
        + b"step=71 loss=4.512 tok/s=19500.0 acc_len=1.30\n"
    header = text(report(1000.0, log, gpu_error=NO_SMI)).splitlines()[0]
    assert header.endswith("step 71 · 19500.0 tok/s · loss 4.512 · τ 1.30 · eval τ 6.81 @ 70"), header
    # an evaluation as the very last line: the header still shows the last training step, not the eval's
    header = text(report(1000.0, log[:log.index(b"step=71")], gpu_error=NO_SMI)).splitlines()[0]
    assert header.endswith("step 70 · 19410.5 tok/s · loss 4.766 · τ 1.21 · eval τ 6.81 @ 70"), header


def test_a_live_evaluation_run_says_what_it_evaluates_instead_of_waiting_for_a_first_step() -> None:
    doc = report(1000.0, b"loading target\n", gpu_error=NO_SMI)
    doc["run"]["meta"].update({"kind": "eval", "evaluates": "20261129-102000-tiny", "started_at_epoch": 0.0,
                               "job": "evaluating run 20261129-102000-tiny"})
    lines = text(doc).splitlines()
    assert "TRAINING" in lines[0]
    assert lines[1] == "  why: evaluating run 20261129-102000-tiny (not a training run: no steps to wait for)"


def test_the_watch_draws_utilisation_memory_and_power_histories_with_the_last_intervals_min_max() -> None:
    from status.test_watcher import smi

    w = Watcher("local", live=True)
    for k in range(4):  # four reports, three readings each: 10 %, 90 %, 97 % at 300, 600, 650 W
        doc = report(1000.0 + k, STEPS, smi=smi((40000 + k * 1000, 97, 650.0)))
        doc["gpus_series"] = [{"source": "nvidia-smi", "nvml": [], "smi_csv": smi((40000 + k * 1000, u, p)),
                               "error": None, "time": 999.0 + k + j / 5}
                              for j, (u, p) in enumerate([(10, 300.0), (90, 600.0), (97, 650.0)], 1)]
        v = w.update(parse_report(doc))
    out = io.StringIO()
    Console(file=out, width=160, color_system=None, force_terminal=False).print(render_view(v, history=True))
    lines = out.getvalue().splitlines()
    header = next(ln for ln in lines if ln.startswith("gpu"))
    assert header.split() == ["gpu", "memory", "used/total", "util", "power", "finding", "health", "utilisation",
                              "history", "memory", "history", "power", "history"]
    row = next(ln for ln in lines if ln.lstrip().startswith("0 "))
    # the means (65.7 %, 43000 of 143771 MiB, 516.7 W of the 650 W peak) as sparklines, then the last min–max
    assert row.split()[11:] == ["▆▆▆▆", "10–97", "%", "▃▃▃▃", "43000", "MiB", "▇▇▇▇", "300–650", "W"], row
    assert "history" not in text(report(1000.0, STEPS, smi=SMI_BUSY))  # one-shot: no histories


def test_a_stall_names_its_shape_and_the_shapes_remedy() -> None:
    spinning = "0, GPU-00000000-0000-4000-8000-000000000000, NVIDIA H200, 88283, 143771, 100, 95.00\n"
    out = io.StringIO()
    doc = report(1000.0, STEPS, smi=spinning)
    del doc["log"]["mtime"]  # one look at a step of unknown age, GPUs spinning at 95 W
    view = Watcher("local").update(parse_report(doc))
    Console(file=out, width=160, color_system=None, force_terminal=False).print(render_view(view))
    got = out.getvalue()
    assert "STALLED" in got.splitlines()[0] and view.health.stall_shape == "spinning"
    assert "  why: spinning: GPU(s) 0 at ≈100 % utilisation at near-idle power (≤ 150 W)" in got
    assert "spinning  GPUs at ≈100 % utilisation at near-idle power" in got
    assert "diagnosis\n  stall: spinning" in got and "NCCL_DEBUG=INFO" in got
    assert view.to_record()["stall_shape"] == "spinning" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in \
        view.to_record()["stall_remedy"]
