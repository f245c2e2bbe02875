"""The log scanner on real program output: tracebacks per thread, progress, and the mess of real logs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.realprog import SEQUENTIAL_THREAD_CRASHES, TORCH_FX_RACE, run_program
from analysis.test_fullscan import report_of
from dflashctl.analysis import logscan
from dflashctl.analysis.health import active_hits
from dflashctl.analysis.logscan import LogScanner, Traceback, scan
from dflashctl.analysis.progress import parse_progress

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def thread_log() -> bytes:
    return run_program(SEQUENTIAL_THREAD_CRASHES)


def test_thread_tracebacks_are_attributed_with_whole_text_and_chain(thread_log: bytes) -> None:
    r = scan(thread_log)
    assert [tb.thread for tb in r.tracebacks] == ["drafter-0", "drafter-1", "drafter-2"]
    for i, tb in enumerate(r.tracebacks):
        assert tb.exc_type == "RuntimeError"
        assert tb.message == f"drafter {i} lost its block"
        assert tb.chain == [("KeyError", f"'block-{i}'")]
        assert tb.text.startswith(f"Exception in thread drafter-{i}:\nTraceback (most recent call last):")
        assert "The above exception was the direct cause of the following exception:" in tb.text
        assert tb.text.rstrip().endswith(f"RuntimeError: drafter {i} lost its block")
        lines = thread_log.decode().splitlines()
        assert lines[tb.first_line - 1] == f"Exception in thread drafter-{i}:"
    assert set(r.threads) == {"drafter-0", "drafter-1", "drafter-2"}
    assert all(t.state == "crashed" and t.exception == "RuntimeError" for t in r.threads.values())
    assert r.final_exception == "RuntimeError"


def test_progress_lines_between_tracebacks_are_not_swallowed(thread_log: bytes) -> None:
    r = scan(thread_log)
    assert [p.values["step"] for p in r.progress] == [0, 1, 2, 3, 4, 5]
    first = r.progress[0].values
    assert first == {"step": 0, "loss": 4.0, "tok/s": 1834.2, "lr": 3e-4, "acc": 0.123, "acc_len": 2.5}
    assert r.last_line_no == thread_log.count(b"\n")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_feeding_in_random_pieces_gives_the_same_report_as_one_scan(thread_log: bytes, seed: int) -> None:
    rng = random.Random(seed)
    s = LogScanner()
    pos = 0
    while pos < len(thread_log):
        n = rng.randint(1, 40)
        s.feed(thread_log[pos : pos + n])
        pos += n
    s.flush()
    a, b = s.report(), scan(thread_log)
    assert [(t.thread, t.text, t.exc_type) for t in a.tracebacks] == [(t.thread, t.text, t.exc_type)
                                                                       for t in b.tracebacks]
    assert [p.values for p in a.progress] == [p.values for p in b.progress]
    assert a.last_line_no == b.last_line_no


def test_feed_returns_events_in_log_order_once_each(thread_log: bytes) -> None:
    s = LogScanner()
    events = s.feed(thread_log) + s.flush()
    kinds = [type(e).__name__ for e in events if type(e).__name__ != "SignatureHit"]
    assert kinds.count("Traceback") == 3 and kinds.count("ProgressPoint") == 6
    tbs = [e for e in events if isinstance(e, Traceback)]
    assert [t.thread for t in tbs] == ["drafter-0", "drafter-1", "drafter-2"]


def test_open_traceback_shows_in_report_before_the_next_line_arrives(thread_log: bytes) -> None:
    """Watch latency: a crash counts as soon as its final line is in, not when the log moves on."""
    last = b"RuntimeError: drafter 0 lost its block\n"
    cut = thread_log.index(last) + len(last)
    s = LogScanner()
    s.feed(thread_log[:cut])
    r = s.report()
    assert [t.thread for t in r.tracebacks] == ["drafter-0"]
    assert r.threads["drafter-0"].message == "drafter 0 lost its block"
    s.feed(thread_log[cut:])  # the rest still parses; the provisional copy did not consume anything
    s.flush()
    assert [t.thread for t in s.report().tracebacks] == ["drafter-0", "drafter-1", "drafter-2"]


def test_main_thread_traceback_has_no_thread_and_is_final() -> None:
    out = run_program("""
        print("step=7 loss=2.0000 tok/s=10.0 lr=1.00e-04 acc=0.5", flush=True)
        def load():
            import flash_attn_missing_module
        load()
    """)
    r = scan(out)
    assert len(r.tracebacks) == 1
    tb = r.tracebacks[0]
    assert tb.thread is None and tb.exc_type == "ModuleNotFoundError"
    assert tb.message == "No module named 'flash_attn_missing_module'"
    assert [h.signature.id for h in r.hits] == ["import-error"]
    assert r.threads == {}


CONCURRENT = """
    import sys, threading
    sys.stderr = sys.stdout
    barrier = threading.Barrier(3)
    def work(i):
        barrier.wait()
        raise ValueError("worker %d failed" % i)
    ts = [threading.Thread(target=work, args=(i,), name="drafter-%d" % i) for i in range(3)]
    for t in ts: t.start()
    for t in ts: t.join()
    print("step=1 loss=1.0 tok/s=1.0 lr=1.00e-04 acc=0.1", flush=True)
"""


def test_concurrent_thread_crashes_never_invent_threads_or_exceptions() -> None:
    """Threads that die together write half-lines into each other's tracebacks (live, so the interleaving
    differs every run: only what holds for every interleaving is asserted — a name or exception line may be cut
    past rebuilding, so how much is recovered is asserted on the recorded cases below, never here)."""
    out = run_program(CONCURRENT)
    r = scan(out)
    names = {f"drafter-{i}" for i in range(3)}
    assert set(r.threads) <= names, out.decode()
    # `Traceback (most recent call last):` is one write: at least one traceback is always found
    assert r.tracebacks, out.decode()
    # an exception line itself can be cut and glued (`ValueErrorValueError: : worker 0 failedworker 2 …`)
    assert all(t.exc_type is None or "ValueError" in t.exc_type for t in r.tracebacks), out.decode()
    assert sum(1 for t in r.tracebacks if t.exc_type is not None) <= 3, out.decode()
    assert r.progress and r.progress[-1].values["step"] == 1


@pytest.mark.parametrize("name", sorted(p.name for p in (DATA / "interleaved-hard").glob("*.log")))
def test_recorded_garbled_interleavings_lose_at_most_never_invent(name: str) -> None:
    """Real outputs where even exception lines were cut in pieces: what cannot be rebuilt is left out."""
    r = scan((DATA / "interleaved-hard" / name).read_bytes())
    assert r.threads and set(r.threads) <= {"drafter-0", "drafter-1", "drafter-2"}
    assert r.tracebacks and all(t.exc_type in (None, "ValueError") for t in r.tracebacks)
    assert all(t.message in (None, "worker 0 failed", "worker 1 failed", "worker 2 failed") for t in r.tracebacks)


@pytest.mark.parametrize(
    "name", ["exception-type-glued-to-name.log", "names-glued-to-headers-and-frames.log"]
)
def test_a_cut_headers_name_is_found_under_what_another_thread_glued_to_it(name: str) -> None:
    """Seen in CI and in a stress run: `ValueErrordrafter-1:` (another thread's type before the name),
    `drafter-2Exception in thread :`, `drafter-0Traceback (most …`, `drafter-1  File "…"` (the name's `:`
    lines later). All three names come back, none with a type glued to it."""
    r = scan((DATA / "interleaved-hard" / name).read_bytes())
    assert set(r.threads) == {"drafter-0", "drafter-1", "drafter-2"}


@pytest.mark.parametrize("name", sorted(p.name for p in (DATA / "interleaved").glob("*.log")))
def test_recorded_interleavings_of_three_crashing_threads_are_taken_apart(name: str) -> None:
    """Real outputs of CONCURRENT (recorded): headers cut after `Exception in thread `, names glued
    together or arriving lines later. Each is reconstructed: three threads, three ValueErrors."""
    r = scan((DATA / "interleaved" / name).read_bytes())
    assert sorted(r.threads) == ["drafter-0", "drafter-1", "drafter-2"]
    assert sorted(t.message for t in r.tracebacks) == [f"worker {i} failed" for i in range(3)]
    assert all(t.exc_type == "ValueError" and t.thread for t in r.tracebacks)


@pytest.mark.slow
def test_real_torch_compile_fx_trace_failure_in_a_thread_is_compile_thread_race() -> None:
    out = run_program(TORCH_FX_RACE, timeout=300)
    r = scan(out)
    tb = r.tracebacks[-1]
    assert tb.thread == "drafter-0"
    assert tb.exc_type == "RuntimeError"
    assert tb.message.startswith("Detected that you are using FX to symbolically trace a dynamo-optimized function")
    assert any("torch/_dynamo/" in f for f in tb.frames)
    assert [h.signature.id for h in tb.hits] == ["compile-thread-race"]
    assert r.threads["drafter-0"].state == "crashed"


def test_header_only_lines_as_in_the_seed_grep_mark_threads_crashed() -> None:
    log = b"Exception in thread drafter-0:\nException in thread drafter-1:\nException in thread drafter-2:\n"
    r = scan(log)
    assert sorted(r.threads) == ["drafter-0", "drafter-1", "drafter-2"]
    assert all(t.exception is None for t in r.threads.values())
    assert r.final_exception is None


def test_ansi_colour_carriage_return_bars_and_invalid_utf8_are_tolerated() -> None:
    log = (
        b"\x1b[32mstep=1\x1b[0m loss=3.2000 tok/s=100.0 lr=1.00e-04 acc=0.1\n"
        b"\r 10%|\xe2\x96\x88     | 1/10\r 20%|\xe2\x96\x88\xe2\x96\x88    | 2/10\rstep=2 loss=3.1 tok/s=99.0\n"
        b"bad bytes \xff\xfe here step=3 loss=3.0\n"
        b"Traceback (most recent call last):\n"
        b'  File "\x1b[35mtrain.py\x1b[0m", line 3, in <module>\n'
        b"\x1b[1;35mtorch.OutOfMemoryError\x1b[0m: \x1b[35mCUDA out of memory. Tried to allocate 2.00 GiB\x1b[0m\n"
    )
    r = scan(log)
    assert [p.values["step"] for p in r.progress] == [1, 2, 3]
    assert r.final_exception == "torch.OutOfMemoryError"
    assert r.tracebacks[0].frames == ["train.py"]
    assert {h.signature.id for h in r.hits} == {"cuda-oom"}


def test_truncated_last_line_waits_for_its_end_then_flush_takes_it() -> None:
    s = LogScanner()
    s.feed(b"step=1 loss=2.0\nstep=2 lo")
    assert [p.values["step"] for p in s.report().progress] == [1]
    s.feed(b"ss=1.5\nstep=3 loss=1.")
    assert [p.values.get("loss") for p in s.report().progress] == [2.0, 1.5]
    s.flush()
    assert [p.values.get("loss") for p in s.report().progress] == [2.0, 1.5, 1.0]
    assert s.report().last_line_no == 3


def test_reset_after_rotation_starts_line_numbers_again() -> None:
    s = LogScanner()
    s.feed(b"step=1 loss=2\n" * 10)
    s.reset()
    s.feed(b"step=11 loss=1\n")
    r = s.report()
    assert r.last_line_no == 1 and [p.line for p in r.progress] == [1]


def test_long_carriage_return_line_without_newline_is_bounded() -> None:
    s = LogScanner()
    bar = b"".join(b"\r%3d%%|####| step=%d loss=2.0" % (i % 100, i) for i in range(60000))
    s.feed(bar)
    assert len(s._partial) < 2 << 20  # noqa: SLF001
    assert s.report().progress  # the bar's steps were seen without waiting for a newline


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("step=12 loss=4.1234 tok/s=1834.2 lr=3.00e-04 acc=0.123", {"step": 12, "loss": 4.1234, "tok/s": 1834.2}),
        ("step=12 loss=4.1 tok/s=1.0 lr=3.00e-04 acc=0.1 acc_len=3.25", {"acc_len": 3.25}),
        ("{'loss': 2.3141, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': 0.12}", {"loss": 2.3141, "lr": 5e-05}),
        ("iter 100: loss 2.3012, time 41.23ms, mfu 38.12%", {"step": 100, "loss": 2.3012}),
        ("step:  10  loss:  7.9412  memory: 31.2GiB(39.4%)  tps: 5,138", {"step": 10, "loss": 7.9412}),
        ("step=5 loss=nan tok/s=1.0", {"step": 5}),
        ("eval step=100 acc_len=3.10 tokens_per_forward=2.90", {"step": 100, "acc_len": 3.10}),
    ],
)
def test_progress_forms(line: str, expected: dict[str, float]) -> None:
    p = parse_progress(line, 1)
    assert p is not None
    for k, v in expected.items():
        assert p.values[k] == pytest.approx(v)


@pytest.mark.parametrize(
    "line",
    ["error_rate=0.01 retries=2", "NaN check passed", "validating loss function config", "stepping down lr",
     "resume: continuing from checkpoint step=285", "saving checkpoint at step 500"],
)
def test_lines_that_only_look_like_progress_are_not(line: str) -> None:
    assert parse_progress(line, 1) is None


LINE_KINDS = [
    b"step=%d loss=3.2100 tok/s=1834.2 lr=3.00e-04 acc=0.312 acc_len=2.41",
    b"INFO data: shard 17 loaded, 4096 sequences",
    b"eval: error_rate=0.0123 retries=0 NaN check passed",
    b"step=%d loss=nan tok/s=1.0",
    b"Exception in thread drafter-1:",
    b"Traceback (most recent call last):",
    b'  File "/ws/trainer/pipeline.py", line 210, in drafter_loop',
    b"    loss = self.step(batch)",
    b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    b"RuntimeError: CUDA error: an illegal memory access was encountered",
    b"",
    b"The above exception was the direct cause of the following exception:",
    b"W1129 09:51:13.201000 91451 torch/_dynamo/convert_frame.py:964] torch._dynamo hit config.recompile_limit (8)",
    b"\x1b[31mstep: %d  loss: 2.5\x1b[0m",
    b"\r 10%|#    | 1/10\r 20%|##   | 2/10",
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(LINE_KINDS) - 1), st.integers(0, 10**6)), max_size=120),
       st.lists(st.integers(1, 300), min_size=1, max_size=10), st.sampled_from([2, 5, 1024]))
def test_fast_path_reports_what_the_line_by_line_reference_reports(lines, cuts, keep) -> None:  # noqa: ANN001
    saved, logscan.KEEP_PROGRESS = logscan.KEEP_PROGRESS, keep  # small: the "only the latest" path runs
    try:
        _compare_fast_and_reference(lines, cuts)
    finally:
        logscan.KEEP_PROGRESS = saved


def _compare_fast_and_reference(lines, cuts) -> None:  # noqa: ANN001
    data = b"".join((LINE_KINDS[k] % n if b"%d" in LINE_KINDS[k] else LINE_KINDS[k]) + b"\n" for k, n in lines)

    fast, ref = report_of(data, cuts, fast=True), report_of(data, cuts, fast=False)
    assert [(t.thread, t.first_line, t.text, t.exc_type) for t in fast.tracebacks] == [
        (t.thread, t.first_line, t.text, t.exc_type) for t in ref.tracebacks]
    assert [(p.line, repr(p.values)) for p in fast.progress] == [(p.line, repr(p.values)) for p in ref.progress]
    assert [(h.signature.id, h.line) for h in active_hits(fast)] == [
        (h.signature.id, h.line) for h in active_hits(ref)]
    assert fast.last_line_no == ref.last_line_no == data.count(b"\n")


def test_evidence_is_the_exception_line_not_the_source_line_that_raised_it() -> None:
    log = (b'Exception in thread drafter-0:\nTraceback (most recent call last):\n  File "p.py", line 3, in f\n'
           b'    raise RuntimeError("CUDA error: an illegal memory access was encountered")\n'
           b"RuntimeError: CUDA error: an illegal memory access was encountered\n")
    [hit] = scan(log).hits
    assert (hit.signature.id, hit.line) == ("cuda-illegal-access", 5)
    assert hit.text.startswith("RuntimeError: CUDA error")


# A thread dies with a multi-line message; then each writer that may follow a traceback in a real train.log
# prints one line. TAIL is printed after the traceback by the main thread.
_MULTILINE_THEN = """
import sys, threading
sys.stderr = sys.stdout
def drafter():
    raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled cuda error\\n"
                       "ncclUnhandledCudaError: Call to CUDA function failed.\\n"
                       "Last error:\\n"
                       "    Cuda failure 'out of memory'")
t = threading.Thread(target=drafter, name="drafter-2"); t.start(); t.join()
print(TAIL, flush=True)
print("step=9 loss=2.0000 tok/s=10.0", flush=True)
"""


@pytest.mark.parametrize("tail", [
    "[dflashctl] trainer exited with code 1",
    "trainer: 3 worker threads died",
    "2026-11-29 10:26:59,113 INFO coordinator: checkpoint saved",
    "step=8 loss=2.5000 tok/s=11.0",
    "Exception in thread drafter-3:",
])
def test_the_last_traceback_ends_at_its_message_not_at_the_next_writers_line(tail: str) -> None:
    log = run_program(_MULTILINE_THEN.replace("TAIL", repr(tail)))
    r = scan(log)
    tb = r.tracebacks[0]
    assert tb.thread == "drafter-2" and tb.exc_type == "RuntimeError"
    assert tb.text.endswith("Last error:\n    Cuda failure 'out of memory'")  # the whole message, no more
    assert tail not in tb.text and "step=9" not in tb.text
    assert r.progress[-1].values["step"] == 9

