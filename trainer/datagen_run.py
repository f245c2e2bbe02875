"""`python -m trainer.datagen_run --config C --run-dir R [trainer.data generate arguments]`: data generation as a
dflashctl run.

Generating a data set makes the target answer every prompt: hours on a large model, GPUs held throughout. As a run
it is detached, marked, logged (the progress bar writes one line per update into the log), covered by `status`,
`logs -f`, `stop` and `kill-zombies`, and an ssh drop leaves nothing behind. Rerunning the same command resumes at
the first missing shard. `--config` is the launcher's convention and is not used: generation needs no trainer
config.
"""

from __future__ import annotations

import argparse
import sys

from trainer import datagen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.datagen_run", add_help=False)
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    _, rest = p.parse_known_args(argv)
    return datagen.main(rest)


if __name__ == "__main__":
    sys.exit(main())
