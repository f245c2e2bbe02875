"""`python -m trainer.eval_run --config C --run-dir R [trainer.eval arguments]`: an evaluation as a dflashctl run.

dflashctl starts every program one way (`--config <run>/config.toml --run-dir <run>`, detached, marked, logged), so
an evaluation gets what a training run gets: its own directory and log, `status`, `logs`, `stop`, and no orphan
holding a GPU when the ssh session drops. This adapter takes those two arguments and runs `trainer.eval` with the
rest; the table goes to the log and the report to `<run>/eval.json`. Without `--checkpoint` it evaluates the
step-0 drafter of the run's config (the τ baseline).
"""

from __future__ import annotations

import argparse
import os
import sys

from trainer import eval as evaluation

REPORT = "eval.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.eval_run", add_help=False)
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    ours, rest = p.parse_known_args(argv)
    source = [] if "--checkpoint" in rest else ["--config", ours.config, "--untrained"]
    device = [] if "--device" in rest else ["--device", _drafter_device(ours.config)]
    return evaluation.main([*source, *device, *rest, "--out", os.path.join(ours.run_dir, REPORT)])


def _drafter_device(config: str) -> str:
    """Where the run trained its first drafter: the evaluation's drafter goes there too (not trainer.eval's CPU
    default), next to the target on the devices its config names."""
    from trainer.config import ConfigError, load_config

    try:
        return load_config(config).devices.drafters[0]
    except (ConfigError, IndexError):
        return "cpu"  # trainer.eval reports a bad config itself, in one line


if __name__ == "__main__":
    sys.exit(main())
