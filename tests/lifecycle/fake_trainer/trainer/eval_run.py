"""Stand-in for trainer.eval_run (see __init__.py): the same command line and the same failure when the prompt
file is missing (argparse-style `eval: error: …`, exit 2), none of the measuring. `--wait-file F` holds the failure
back until F exists, so a test decides when the program dies."""

import argparse
import os
import sys
import time


def main():
    p = argparse.ArgumentParser(prog="eval")
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint")
    p.add_argument("--prompts", required=True)
    p.add_argument("--wait-file")
    args, _ = p.parse_known_args()
    print(f"eval: run={os.environ.get('DFLASH_RUN_ID')}", flush=True)
    while args.wait_file and not os.path.exists(args.wait_file):
        time.sleep(0.02)
    if not os.path.exists(args.prompts):
        p.error(f"{args.prompts}: cannot read (No such file or directory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
