"""One `--watch` loop for every live view: one host's (cli/status.py) and a run across hosts' (cli/cluster.py).

A terminal gets the view redrawn in place (rich Live on the real Console: Live enters and measures it); a pipe gets
the final view printed once, 160 columns wide and unwrapped; `--json` gets one JSON line per view. Ctrl-C ends the
watch with 0, else the exit code is the last view's; a view whose run is gone (StatusView.gone: deleted, replaced,
its container or host) ends it with that one line on stderr.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dflashctl.cli.common import Exit, console, error, print_json, rich_console

if TYPE_CHECKING:
    from rich.console import RenderableType


class _View(Protocol):
    @property
    def exit_code(self) -> int: ...

    def to_record(self) -> dict[str, Any]: ...


V = TypeVar("V", bound=_View)


def watch_loop(views: Generator[V, None, None], render: Callable[[V], RenderableType], json_out: bool,
               done: Callable[[V], bool], see: Callable[[V], None] | None = None,
               emit: Callable[[dict[str, Any]], None] = print_json) -> None:
    """Show each view until done(view) says the watch can end (see: a hook on each, e.g. a desktop notification;
    emit: how a --json line is printed); raises Exit with the last view's code. The views are closed on every way
    out (their probes end)."""
    last: V | None = None
    saved_width = console.width
    try:
        if json_out:
            for last in views:
                emit(last.to_record())
                if see:
                    see(last)
                if done(last):
                    break
        else:
            from rich.live import Live

            if not console.is_terminal:
                console.width = 160  # the final view is printed once, unwrapped (cli/statusview.print_wide)
            with Live(console=rich_console(), auto_refresh=False, transient=False) as live:
                for last in views:
                    live.update(render(last), refresh=True)
                    if see:
                        see(last)
                    if done(last):
                        break
    except KeyboardInterrupt:
        raise Exit(0) from None
    finally:
        views.close()
        console.width = saved_width
    gone = getattr(last, "gone_why", None)
    if gone:  # the run is gone (deleted, replaced, its container or host): say why, in one line
        error(gone)
    raise Exit(last.exit_code if last is not None else 0)
