"""analysis/stacks.py on real dumps (tests/analysis/data/stacks/, sources in its README): py-spy's JSON and text,
faulthandler's text, named by the trainer's thread map, innermost frame first, each with its line of code."""

from __future__ import annotations

import json
from pathlib import Path

from dflashctl.analysis.stacks import (
    Frame,
    parse_dump,
    parse_faulthandler,
    parse_py_spy_json,
    parse_py_spy_text,
    processes_from_capture,
    thread_order,
)

DATA = Path(__file__).resolve().parent / "data" / "stacks"
TRAINER_THREADS = ["MainThread", "coordinator", "drafter-0", "drafter-1", "drafter-2"]


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_py_spy_json_of_the_trainer_names_every_thread_with_its_native_id_innermost_frame_first() -> None:
    threads = parse_py_spy_json(read("pyspy-0.4.2-trainer.json"))
    assert [t.thread for t in thread_order(threads)] == TRAINER_THREADS
    assert {t.pid for t in threads} == {23954}
    by_name = {t.thread: t for t in threads}
    assert by_name["MainThread"].native_id == 23954 and by_name["coordinator"].native_id == 23990
    coord = by_name["coordinator"]
    assert coord.frames[0] == Frame("wait", "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", 331)
    assert coord.frames[-1].function == "_bootstrap" and coord.state == "idle"
    assert by_name["drafter-2"].ident == "0x7fec918666c0" and by_name["drafter-2"].state == "active"
    assert by_name["drafter-2"].frames[0].function == "backward"


def test_code_lines_are_looked_up_by_file_and_line() -> None:
    raw = read("pyspy-0.4.2-trainer.json")
    main_file = next(f["filename"] for t in json.loads(raw) for f in t["frames"] if f["name"] == "_supervise")
    threads = parse_py_spy_json(raw, code={f"{main_file}:343": "time.sleep(0.05)"})
    main = next(t for t in threads if t.thread == "MainThread")
    assert main.frames[0].code == "time.sleep(0.05)" and main.frames[1].code is None


def test_py_spy_text_of_the_trainer_equals_its_json_in_names_and_innermost_frames() -> None:
    text = parse_py_spy_text(read("pyspy-0.4.2-trainer.txt"))
    assert [t.thread for t in thread_order(text)] == TRAINER_THREADS
    main = next(t for t in text if t.thread == "MainThread")
    assert (main.pid, main.native_id, main.state, main.ident) == (23954, 23954, "idle", None)
    assert main.frames[0] == Frame("_supervise", "trainer/pipeline.py", 343)
    assert main.frames[-1] == Frame("_run_module_as_main", "<frozen runpy>", 198)
    assert next(t for t in text if t.thread == "coordinator").state == "active"


def test_py_spy_text_with_hex_ids_names_and_no_frames() -> None:
    threads = parse_py_spy_text(read("pyspy-text-gprofiler-612.txt"))
    assert [t.thread for t in threads] == ["MainThread", "Thread-6", "Process Events Listener",
                                           "ThreadPoolExecutor-0_0", "ThreadPoolExecutor-0_1"]
    first = threads[0]
    assert (first.ident, first.native_id, first.state) == ("0x7F768F77C740", None, "idle")
    assert first.frames[0] == Frame("wait", "threading.py", 295) and first.frames[-1].function == "<module>"
    uwsgi = parse_py_spy_text(read("pyspy-text-pyspy-221.txt"))
    assert [(t.pid, t.thread, t.native_id, t.frames) for t in uwsgi] == [(25585, "uWSGIWorker1Core0", 25585, [])]


def test_py_spy_text_of_2018_without_names_and_with_tabs() -> None:
    threads = parse_py_spy_text(read("pyspy-text-ray-3187.txt"))
    assert [t.thread for t in threads] == ["0x7F4AA36D9700", "0x7F4AA2ED8700", "0x7F4AACDE7700"]
    assert threads[1].frames[0] == Frame("recv", "redis/_compat.py", 79) and len(threads[1].frames) == 12
    assert threads[2].frames[-1] == Frame("<module>", "ray/workers/default_worker.py", 105)


def test_faulthandler_dump_of_the_trainer_is_named_by_its_thread_map() -> None:
    names = json.loads(read("faulthandler-py3.11-trainer.threads.json"))
    threads = parse_faulthandler(read("faulthandler-py3.11-trainer.txt"), names=names, pid=23954)
    assert [t.thread for t in thread_order(threads)] == TRAINER_THREADS
    main = next(t for t in threads if t.thread == "MainThread")
    assert (main.pid, main.native_id, main.state, main.ident) == (23954, 23954, "current", "0x00007fecb8429b80")
    assert main.frames[0] == Frame("_supervise", "/work/main/trainer/pipeline.py", 343)
    d0 = next(t for t in threads if t.thread == "drafter-0")
    assert d0.native_id == 23991 and d0.state is None
    assert [f.function for f in d0.frames[:3]] == ["mask_mod", "dense_mask", "_forward"]


def test_faulthandler_without_a_map_names_threads_by_ident() -> None:
    threads = parse_faulthandler(read("faulthandler-py3.11-trainer.txt"))
    assert {t.thread for t in threads} == {"0x00007fec918666c0", "0x00007fec920676c0", "0x00007fec928686c0",
                                           "0x00007fec930696c0", "0x00007fecb8429b80"}
    # keys of the map match by value: py-spy's unpadded ident names the same thread
    assert parse_faulthandler(read("faulthandler-py3.11-trainer.txt"),
                              names={"0x7fec918666c0": {"name": "drafter-2"}})[0].thread == "drafter-2"


def test_faulthandler_dumps_from_issues() -> None:
    swift = parse_faulthandler(read("faulthandler-ms-swift-4867.txt"))
    assert [len(t.frames) for t in swift] == [5, 5, 1] and swift[2].state == "current"
    assert swift[1].frames[0].function == "_recv_msg" and swift[1].frames[0].line == 53
    torch = parse_faulthandler(read("faulthandler-pytorch-54818.txt"))
    assert [t.state for t in torch] == ["current", None]
    assert torch[1].frames[0] == Frame("barrier", "torch/distributed/distributed_c10d.py", 2477)
    py314 = parse_faulthandler(read("faulthandler-py3.14-tinygrad-18190.txt"))
    assert [t.ident for t in py314] == ["0x000000016e143000", "0x00000001f3192240"]
    assert py314[1].frames[0] == Frame("test_gil_sleep", "/Users/chris/fun/tinygrad/test_timeout.py", 9)
    fatal = parse_faulthandler(read("faulthandler-fatal-ms-swift-5231.txt"))
    assert [(t.thread, t.frames) for t in fatal] == [("0x00007f08417fe640", [])]


def test_a_dump_copied_out_of_a_log_keeps_its_prefix_on_every_line() -> None:
    threads = parse_faulthandler(read("faulthandler-prefixed-vllm-20431.txt"))
    assert [len(t.frames) for t in threads] == [0, 4]
    assert threads[1].frames[0].function == "_report_continous_usage" and threads[1].frames[0].line == 229


def test_parse_dump_recognises_each_format() -> None:
    for name, first in (("pyspy-0.4.2-trainer.json", "drafter-2"), ("pyspy-0.4.2-trainer.txt", "MainThread"),
                        ("faulthandler-ms-swift-4867.txt", "0x00007f55b6ffd700"),
                        ("pyspy-text-gprofiler-612.txt", "MainThread")):
        threads = parse_dump(read(name), pid=7)
        assert threads and threads[0].thread == first, name
        assert all(t.pid is not None for t in threads)


def test_garbage_and_a_cut_dump_are_read_as_far_as_they_go() -> None:
    assert parse_py_spy_json("[{not json") == [] and parse_py_spy_json('{"a": 1}') == []
    assert parse_faulthandler("nothing here\n") == [] and parse_py_spy_text("") == []
    cut = read("faulthandler-py3.11-trainer.txt")[:700]
    assert parse_faulthandler(cut)[0].frames[0].function == "wait"


def test_a_capture_doc_becomes_process_records_with_code_and_reasons() -> None:
    raw = read("faulthandler-py3.11-trainer.txt")
    names = json.loads(read("faulthandler-py3.11-trainer.threads.json"))
    doc = {"processes": [
        {"pid": 23954, "role": "program", "argv": ["python3", "-m", "trainer"], "method": "faulthandler",
         "format": "faulthandler", "raw": raw, "threads": names,
         "code": {"/work/main/trainer/pipeline.py:343": "time.sleep(0.05)"}, "error": None,
         "notes": ["py-spy: Permission Denied"]},
        {"pid": 24000, "role": "child", "argv": ["sh"], "method": None, "raw": None, "error": "no py-spy"},
        {"pid": "junk"},
    ]}
    trainer, child = processes_from_capture(doc)
    assert [t.thread for t in trainer.threads] == TRAINER_THREADS
    assert trainer.threads[0].frames[0].code == "time.sleep(0.05)" and trainer.notes == ["py-spy: Permission Denied"]
    assert (child.method, child.threads, child.error) == (None, [], "no py-spy")
    rec = trainer.to_record()
    assert rec["threads"][0]["frames"][0] == {"function": "_supervise", "file": "/work/main/trainer/pipeline.py",
                                              "line": 343, "code": "time.sleep(0.05)"}
    empty = processes_from_capture({"processes": [{"pid": 5, "method": "py-spy", "format": "py-spy-json",
                                                   "raw": "[]"}]})
    assert empty[0].method is None and empty[0].error == "py-spy gave no Python thread"
