"""One call per host, concurrently: a bounded pool, a deadline per host, results in the order given.

`status --all` and `hosts check` reach many hosts at once. A ThreadPoolExecutor would do the pool, but its
workers are joined when the interpreter exits, so one host that never answers (a TCP connection accepted and then
silent, a `pct exec` stuck on a hung container) would hold the command's exit for as long as it hangs. Here the
workers are daemon threads: a host past its deadline gets the row `late(item, seconds)` gives, the command ends
at once, and the stuck call dies with the process.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

HOST_DEADLINE_S = 90.0  # the longest one host may take; beyond the connect (10 s) and a probe's own 60 s limit


def fan_out(items: Sequence[T], call: Callable[[T], R], late: Callable[[T, float], R], *, workers: int = 16,
            deadline_s: float = HOST_DEADLINE_S) -> list[R]:
    """call(item) for every item, at most `workers` at a time; each item's clock starts when a worker takes it
    (waiting for a free worker is not charged to it). A call that raises is the caller's bug: re-raised here."""
    n = len(items)
    if n == 0:
        return []
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(n):
        todo.put(i)
    done: queue.SimpleQueue[tuple[int, bool, object]] = queue.SimpleQueue()
    started: dict[int, float] = {}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            with lock:
                started[i] = time.monotonic()
            try:
                done.put((i, True, call(items[i])))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                done.put((i, False, e))

    for k in range(min(workers, n)):
        threading.Thread(target=worker, name=f"fanout-{k}", daemon=True).start()
    results: dict[int, R] = {}
    while len(results) < n:
        with lock:
            running = [i for i in started if i not in results]
        now = time.monotonic()
        for i in running:
            if now - started[i] >= deadline_s:
                results[i] = late(items[i], deadline_s)
        waits = [started[i] + deadline_s - now for i in running if i not in results]
        try:
            i, ok, value = done.get(timeout=max(0.01, min(waits, default=0.1)))
        except queue.Empty:
            continue
        if not ok:
            raise value  # type: ignore[misc]
        results.setdefault(i, value)  # type: ignore[arg-type]
    return [results[i] for i in range(n)]
