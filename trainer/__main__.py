"""`python -m trainer --config FILE.toml --run-dir DIR [--resume] [--set section.key=value ...]`.

Exit codes: 0 finished, 1 a thread failed (abort), 2 bad arguments or config (one line on stderr), 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse would print usage + error)
        print(f"trainer: error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m trainer", description="Multi-threaded DFlash drafter training.")
    p.add_argument("--config", help="TOML config (relative paths resolve from the working directory)")
    p.add_argument("--run-dir", help="run directory (default: runs/<DFLASH_RUN_ID or timestamp>)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the run dir")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable), typed like the default")
    p.add_argument("--init-from", metavar="DIR",
                   help="start from a drafter directory in the reference layout (config.json + model.safetensors: "
                        "`python -m trainer.export` output or a published DFlash drafter)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trainer.config import ConfigError, load_config  # no torch import: a bad config fails in milliseconds

    try:
        cfg = load_config(args.config, [*args.set, *([f"drafter.init_from={args.init_from}"] if args.init_from
                                                     else [])])
    except ConfigError as e:
        print(f"trainer: config error: {e}", file=sys.stderr, flush=True)
        return 2
    from trainer.distributed import DistError, backend_for, join, place_devices, read_env

    try:
        dist = read_env()  # torchrun's RANK / WORLD_SIZE / ...; none = one process, as before
    except DistError as e:
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return 2
    if dist.active and cfg.runtime.on_worker_failure != "abort":
        print("trainer: config error: runtime.on_worker_failure = 'continue' is for one process only (a rank "
              "that lost a replica would weigh the global mean wrongly); use 'abort' with WORLD_SIZE > 1",
              file=sys.stderr, flush=True)
        return 2
    cfg.devices.target, cfg.devices.drafters = place_devices(list(cfg.devices.target), list(cfg.devices.drafters),
                                                             dist)
    run_id = os.environ.get("DFLASH_RUN_ID") or time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir or Path("runs") / run_id)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"trainer: error: cannot create run dir {run_dir}: {e}", file=sys.stderr, flush=True)
        return 2
    # SIGTERM is honoured from here on, even while torch imports and the models build (minutes on big targets)
    stop = threading.Event()
    mark = f"[rank {dist.rank}] " if dist.rank else ""

    def on_sigterm(signum: int, frame: object) -> None:
        if not stop.is_set():
            print(f"{mark}received SIGTERM: finishing the current step, then checkpoint and exit 143", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    from trainer.threaddump import install as install_dump_signal  # SIGUSR1: every thread's stack, to stacks/

    note = install_dump_signal(run_dir)
    if note:
        print(note, flush=True)
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    from trainer.dataset import DataError
    from trainer.devices import device_problem
    from trainer.drafter_format import DrafterFormatError
    from trainer.eval import EvalError
    from trainer.hf_config import HFConfigError
    from trainer.pipeline import Trainer

    problem = device_problem(list(cfg.devices.target) + list(cfg.devices.drafters))
    if problem:
        print(f"trainer: error: {problem}", file=sys.stderr, flush=True)
        return 2
    try:
        join(dist, backend_for(list(cfg.devices.drafters), cfg.runtime.dist_backend), cfg.runtime.dist_timeout_s,
             cfg.devices.drafters[0])
    except DistError as e:
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return 2
    if dist.rank:
        from trainer.telemetry import set_prefix

        set_prefix(f"[rank {dist.rank}] ")  # rank 0's lines are the run's log; the others' are marked
    try:
        trainer = Trainer(cfg, run_dir, resume=args.resume, dist=dist)
    except (HFConfigError, DataError, EvalError, DrafterFormatError) as e:  # checkpoint, data, prompts, init_from
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return 2
    trainer.sup.stop = stop
    return trainer.run()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if code in (0, 2):
        sys.exit(code)
    os._exit(code)  # abort / SIGTERM: do not wait on threads that may be stuck in C code
