"""Entry point of the stand-in trainer (see __init__.py).

Modes: train (steps until `steps`, SIGTERM -> exit 143), ignore-term (trains, ignores SIGTERM: only
SIGKILL ends it; so do its `children`, which therefore outlive it), exit-at-once (prints an error,
exit 3; with `wait_file`, only once that file exists), crash-threads (after `delay_s` and once `wait_file`
exists, three drafter threads raise; their tracebacks go to the log and errors/<thread>.json; exit 1).
`stop_file`: train / ignore-term end (exit 0) once that file exists.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback


def load_config(path):
    try:
        import tomllib

        with open(path, "rb") as f:
            return tomllib.load(f)
    except ImportError:  # python < 3.11 in the container: the configs here are flat key = value
        out = {}
        with open(path) as f:
            for line in f:
                if "=" in line and not line.lstrip().startswith("#"):
                    k, v = line.split("=", 1)
                    out[k.strip()] = json.loads(v.strip())
        return out


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    args, extra = p.parse_known_args()
    cfg = load_config(args.config)
    write_json(os.path.join(args.run_dir, "argv.json"),
               {"argv": sys.argv, "extra": extra, "run_id": os.environ.get("DFLASH_RUN_ID"), "cwd": os.getcwd()})
    mode = cfg.get("mode", "train")
    print(f"trainer: mode={mode} run={os.environ.get('DFLASH_RUN_ID')}", flush=True)
    if mode == "exit-at-once":
        wait_for_file(cfg.get("wait_file"))
        print("fatal: cannot open dataset /data/missing.jsonl", flush=True)
        return 3
    if mode == "crash-threads":
        time.sleep(float(cfg.get("delay_s", 0)))
        wait_for_file(cfg.get("wait_file"))
        return crash_threads(args.run_dir)
    stop = threading.Event()
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
                for _ in range(int(cfg.get("children", 0)))]
    stop_file = cfg.get("stop_file")
    for step in range(1, int(cfg.get("steps", 10**9)) + 1):
        if stop_file and os.path.exists(stop_file):
            break  # told to finish now: ends like a completed run (exit 0)
        if stop.wait(float(cfg.get("step_s", 0.2))):
            print("trainer: SIGTERM received, checkpoint written, exiting", flush=True)
            return 143
        print(f"step={step} loss={5.0 / step:.4f} tok/s=1234.5 lr=3.00e-04 acc=0.{step % 10}", flush=True)
        write_json(os.path.join(args.run_dir, "heartbeat.json"), {"step": step, "time": time.time()})
    for c in children:
        c.terminate()
    return 0


def wait_for_file(path):
    """Block until `path` exists (a test's trigger: the moment of death made explicit, never a sleep)."""
    while path and not os.path.exists(path):
        time.sleep(0.02)


def crash_threads(run_dir):
    os.makedirs(os.path.join(run_dir, "errors"), exist_ok=True)

    def work(name):
        try:
            raise RuntimeError(f"Detected that you are using FX to symbolically trace a dynamo-optimized "
                               f"function ({name})")
        except RuntimeError as e:
            write_json(os.path.join(run_dir, "errors", f"{name}.json"),
                       {"type": "RuntimeError", "message": str(e), "traceback": traceback.format_exc()})
            raise

    threads = [threading.Thread(target=work, args=(f"drafter-{i}",), name=f"drafter-{i}") for i in range(3)]
    for t in threads:
        t.start()
        t.join()
    print("trainer: 3 worker threads died", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
