"""The live view's state without a terminal: keys move the selection through every process in screen order (and
wrap), `s` cycles the order, `q` leaves; each reading adds to each GPU's history; arrows arrive as escape codes."""

from __future__ import annotations

import io

from rich.console import Console

from dflashctl.analysis.hostgpus import Runs, build_view
from dflashctl.cli.gpustui import KeyReader, Screen

APPS = ("pid, process_name, used_gpu_memory [MiB], gpu_uuid\n"
        "300, a, 100, GPU-0\n100, b, 5000, GPU-0\n200, c, 70, GPU-1\n")


def _view(util0: int, t: float):
    csv = ("index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], power.draw [W]\n"
           f"0, GPU-0, H100, 5100, 81559, {util0}, 300.00\n1, GPU-1, H100, 70, 81559, 0, 70.00\n")
    info = {str(p): {"cgroup": "0::/lxc/200/ns\n", "nspid": [p, p // 100], "uid": 0, "user": "root",
                     "cmdline": f"proc {p}", "run_id": None, "starttime": 1} for p in (100, 200, 300)}
    doc = {"time": t, "gpus": {"source": "nvidia-smi", "smi_csv": csv}, "apps_csv": APPS, "procs": info}
    return build_view([doc], host="pve", ours="200", runs=Runs(), seen_from="host")


def _text(screen: Screen) -> str:
    console = Console(width=150, record=True, file=io.StringIO())
    console.print(screen.render())
    return console.export_text()


def test_keys_select_sort_and_quit():
    screen = Screen()
    screen.update(_view(90, 1.0))
    assert [p.pid for p in screen.procs()] == [100, 300, 200]  # by GPU, then memory (largest first)
    assert "selected: pid 100" in _text(screen)
    for k in ("j", "down"):
        assert screen.key(k)
    assert "selected: pid 200" in _text(screen)
    assert screen.key("j") and "selected: pid 100" in _text(screen)  # wraps to the first
    assert screen.key("k") and "selected: pid 200" in _text(screen)
    assert screen.key("s") and screen.sort == "pid"
    assert [p.pid for p in screen.procs()] == [100, 300, 200]
    assert screen.key("s") and screen.key("s") and screen.key("s") and screen.sort == "memory"
    assert not screen.key("q")


def test_each_reading_adds_to_the_gpus_sparklines():
    screen = Screen()
    for i, util in enumerate((0, 50, 100)):
        screen.update(_view(util, float(i)))
    assert list(screen.util[0]) == [0.0, 50.0, 100.0]
    line = next(ln for ln in _text(screen).splitlines() if ln.startswith("  UTIL") and "100 %" in ln)
    assert line.rstrip().endswith("▁▄█")


def test_arrow_keys_arrive_as_escape_sequences():
    import os

    r, w = os.pipe()
    reader = KeyReader()
    reader.fd = r  # a pipe stands in for the terminal: the bytes a terminal sends for ↓, ↑, then q
    os.write(w, b"\x1b[B\x1b[Aq")
    assert reader.read(5.0) == ["down", "up", "q"]
    os.close(r)
    os.close(w)
