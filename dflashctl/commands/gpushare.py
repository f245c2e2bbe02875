"""status's share of the host view (issue 29): the memory the run's own processes hold on each GPU against what
every other process holds there, read with `gpus`' host probe beside the status probe (the two waits overlap)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from dflashctl.analysis.hostgpus import Runs, share
from dflashctl.commands import gpus
from dflashctl.errors import DflashError
from dflashctl.remote.target import Target


class ShareReading:
    """The host reading, started now in a thread; share(run_id) once the probe has said which run is live."""

    def __init__(self, target: Target, timeout: float | None = 30):
        self.target = target
        self.doc: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._read, args=(timeout,), name="gpu-share", daemon=True)
        self.thread.start()

    def _read(self, timeout: float | None) -> None:
        with contextlib.suppress(DflashError):
            self.doc = gpus.host_reading(self.target, timeout)

    def share(self, run_id: str | None, wait_s: float = 5.0) -> dict[int, tuple[float, float]] | None:
        """GPU index → (MiB of run_id's processes, MiB of all others); None when the host could not be read, lists
        no process (nothing to split), or is still reading wait_s after the probe answered (status does not wait on
        a slow host for a column: it started with the probe, so it is usually done first)."""
        self.thread.join(wait_s)
        if self.doc is None or not self.doc.get("apps_csv"):
            return None
        view = gpus.view_of(self.target, [self.doc], Runs(run_id, None))
        return share(view) if any(g.procs for g in view.gpus) else None
