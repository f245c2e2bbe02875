"""Watcher: what status carries from one probe report to the next (reports shaped per the probe contract)."""

from __future__ import annotations

import base64

from dflashctl.commands.status import Watcher
from dflashctl.model import Verdict
from dflashctl.report import parse_report

SMI_IDLE = "0, GPU-00000000-0000-4000-8000-000000000000, NVIDIA H200, 88283, 143771, 0, 118.00\n"


def report(t: float, data: bytes = b"", *, offset: int = 0, rotated: bool = False, alive: bool = True,
           exit_code: int | None = None, smi: str | None = None, inode: int = 7) -> dict:
    return {
        "probe_version": 1, "time": t, "hostname": "ct200",
        "run": {"id": "r1", "dir": "/ws/runs/r1", "meta": {"started_at_epoch": 0.0}, "pid": 42, "alive": alive,
                "exit_code": exit_code, "stopped": False, "heartbeat": None, "errors": {}},
        "log": {"path": "/ws/runs/r1/train.log", "size": offset + len(data), "inode": inode, "offset": offset,
                "next_offset": offset + len(data), "data_b64": base64.b64encode(data).decode(), "rotated": rotated},
        "gpus": {"source": "nvidia-smi" if smi else None, "nvml": [], "smi_csv": smi, "error": None},
    }


def steps(a: int, b: int) -> bytes:
    return b"".join(b"step=%d loss=3.0 tok/s=100.0 lr=1.00e-04 acc=0.1\n" % i for i in range(a, b))


def test_no_new_step_for_the_stall_window_is_stalled() -> None:
    w = Watcher("pve", live=True)
    data = steps(1, 6)
    assert w.update(parse_report(report(1000.0, data))).health.verdict == Verdict.TRAINING
    v = w.update(parse_report(report(1200.0, offset=len(data))))
    assert v.health.verdict == Verdict.TRAINING and v.health.seconds_since_progress == 200
    v = w.update(parse_report(report(1301.0, offset=len(data))))
    assert v.health.verdict == Verdict.STALLED and v.exit_code == 104
    assert v.seconds_since_log == 301


def test_first_look_in_watch_mode_trusts_moving_steps_but_one_shot_trusts_idle_gpus() -> None:
    data = steps(1, 6)
    assert Watcher("pve", live=True).update(parse_report(report(50.0, data, smi=SMI_IDLE))).health.verdict \
        == Verdict.TRAINING
    v = Watcher("pve").update(parse_report(report(50.0, data, smi=SMI_IDLE)))
    assert v.health.verdict == Verdict.STALLED  # one look, every GPU holding memory at 0 %: the seed's picture
    assert [str(g.finding) for g in v.health.gpus] == ["idle-allocated"]


def test_rotated_log_is_read_again_from_line_one() -> None:
    w = Watcher("pve", live=True)
    first = steps(1, 100)
    w.update(parse_report(report(1.0, first)))
    new = b"step=100 loss=2.0\nTraceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n" \
          b"torch.OutOfMemoryError: CUDA out of memory.\n"
    v = w.update(parse_report(report(2.0, new, rotated=True, inode=8, alive=False, exit_code=1)))
    assert v.health.verdict == Verdict.CRASHED
    assert v.health.hits[0].line == 4  # counted in the new file, not after the old one's 99 lines
    assert v.log_bytes_scanned == len(new)  # the scanner was reset: only the new file counts


def test_a_tail_that_starts_mid_line_skips_the_partial_line() -> None:
    w = Watcher("pve")
    v = w.update(parse_report(report(1.0, b"=4 loss=9.9 tok/s=1\nstep=5 loss=3.0 tok/s=100.0\n", offset=123456)))
    assert v.health.progress["step"] == 5 and not v.log_lines_from_start
    assert v.to_record()["log"]["lines_from_start"] is False


def test_new_run_behind_latest_starts_over() -> None:
    w = Watcher("pve", live=True)
    w.update(parse_report(report(1.0, steps(1, 50))))
    doc = report(2.0, steps(1, 3))
    doc["run"]["id"] = "r2"
    v = w.update(parse_report(doc))
    assert v.run_id == "r2" and v.health.progress["step"] == 2 and v.log_bytes_scanned == len(steps(1, 3))


def test_one_shot_last_log_age_comes_from_the_logs_mtime() -> None:
    doc = report(1000.0, steps(1, 6))
    doc["log"]["mtime"] = 958.0  # the probe's stat of train.log: last written 42 s before the report
    v = Watcher("pve").update(parse_report(doc))
    assert v.seconds_since_log == 42
    del doc["log"]["mtime"]  # an older probe: no mtime, the bytes count as just seen
    assert Watcher("pve").update(parse_report(doc)).seconds_since_log == 0


def test_a_watch_does_not_call_a_run_lost_while_its_exit_code_is_being_written() -> None:
    from dflashctl.analysis.verdict import EXIT_CODE_GRACE_S
    from dflashctl.commands.status import is_failure

    w = Watcher("pve", live=True)
    w.update(parse_report(report(100.0, steps(1, 6))))
    # exited; supervisor still reaping
    gone = w.update(parse_report(report(101.0, offset=len(steps(1, 6)), alive=False)))
    assert gone.health.verdict == Verdict.LOST and gone.settling and not is_failure(gone)
    done = w.update(parse_report(report(102.0, offset=len(steps(1, 6)), alive=False, exit_code=0)))
    assert done.health.verdict == Verdict.FINISHED and not done.settling
    w = Watcher("pve", live=True)
    w.update(parse_report(report(100.0, steps(1, 6), alive=False)))
    lost = w.update(parse_report(report(100.0 + EXIT_CODE_GRACE_S, offset=len(steps(1, 6)), alive=False)))
    assert lost.health.verdict == Verdict.LOST and not lost.settling and is_failure(lost)  # nobody wrote one


# -- each GPU's history: every reading of a report interval reduced to (min, mean, max) ---------------------------

SMI_HEADER = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], power.draw [W]\n"


def smi(*gpus: tuple[float, float, float]) -> str:
    """nvidia-smi CSV as the probe sends it: one (memory used MiB, utilisation %, power W) per GPU."""
    rows = [f"{i}, GPU-{i:08x}-0000-4000-8000-{i:012x}, NVIDIA H200, {m:g}, 143771, {u:g}, {p:.2f}\n"
            for i, (m, u, p) in enumerate(gpus)]
    return SMI_HEADER + "".join(rows)


def watched(t: float, readings: list[str], **kw: object) -> dict:
    """A --watch report whose interval held these readings (the last is the report's own `gpus`)."""
    doc = report(t, smi=readings[-1], **kw)
    doc["gpus_series"] = [{"source": "nvidia-smi", "nvml": [], "smi_csv": r, "error": None, "time": t - 1 + k / 5}
                          for k, r in enumerate(readings, 1)]
    return doc


def test_reduce_interval_is_min_mean_max_per_gpu_and_none_where_nothing_was_read() -> None:
    from dflashctl.analysis.gpuwindow import reduce_interval
    from dflashctl.model import GpuSample

    got = reduce_interval([(GpuSample(0, memory_used_mib=100, utilization_pct=10, power_w=None),
                            GpuSample(1, memory_used_mib=5, utilization_pct=None)),
                           (GpuSample(0, memory_used_mib=300, utilization_pct=30, power_w=None),)])
    assert got == {0: {"util": (10, 20, 30), "memory_mib": (100, 200, 300), "power_w": None},
                   1: {"util": None, "memory_mib": (5, 5, 5), "power_w": None}}


def test_the_watcher_keeps_each_gpus_reduced_series_per_report_oldest_first() -> None:
    w = Watcher("pve", live=True)
    w.update(parse_report(watched(100.0, [smi((1000, 10, 100), (2000, 0, 60)), smi((3000, 90, 300), (2000, 0, 60))])))
    v = w.update(parse_report(watched(101.0, [smi((4000, 50, 200), (2000, 0, 60))] * 3)))
    g0, g1 = v.health.gpus
    assert g0.series == {"util": [(10, 50, 90), (50, 50, 50)], "memory_mib": [(1000, 2000, 3000), (4000, 4000, 4000)],
                         "power_w": [(100, 200, 300), (200, 200, 200)]}
    assert g1.series["util"] == [(0, 0, 0), (0, 0, 0)]
    rec = v.to_record()["gpus"][0]  # --json: the same numbers, as lists
    assert rec["series"]["util"] == [[10, 50, 90], [50, 50, 50]]
    assert rec["utilization_pct"] == 50 and rec["history"] == [90, 50]  # the judge still sees one reading a report


def test_a_report_without_a_series_is_one_reading_and_a_gpu_gone_from_a_report_is_a_gap() -> None:
    w = Watcher("pve", live=True)
    w.update(parse_report(report(100.0, smi=smi((1000, 10, 100), (2000, 20, 120)))))  # one-shot / older probe
    v = w.update(parse_report(report(101.0, smi=smi((1000, 30, 110)))))  # GPU 1 fell off the bus
    assert v.health.gpus[0].series["util"] == [(10, 10, 10), (30, 30, 30)]
    assert w.series[1].lists()["util"] == [(20, 20, 20), None]
    v = w.update(parse_report(report(102.0)))  # no readings at all this time: a gap in every series
    assert v.health.gpus[0].series["power_w"] == [(100, 100, 100), (110, 110, 110), None]


def test_the_series_keeps_the_last_history_intervals() -> None:
    from dflashctl.analysis.watcher import HISTORY

    w = Watcher("pve", live=True)
    for k in range(HISTORY + 5):
        v = w.update(parse_report(watched(100.0 + k, [smi((1000, k % 100, 100))])))
    spans = v.health.gpus[0].series["util"]
    assert len(spans) == HISTORY and spans[-1] == ((HISTORY + 4) % 100,) * 3 and spans[0] == (5, 5, 5)
