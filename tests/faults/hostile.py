"""A container that answers with hostile data: the `python` of a test host (hosts.toml `python = <this, wrapped>`).

It runs the real interpreter and rewrites what the container says, as a compromised or broken container could:
- $HOSTILE_RUN_ID: every run id in the probe's framed replies (DFLASH-RESULT lines) becomes this value;
- $HOSTILE_EXPORT: `-m trainer.export` prints this line instead of exporting (after making the folder its `out`
  names, with the two files, so a copy can follow); `auto:DIR:SIZE` makes DIR with a SIZE-byte model file and
  prints the honest reply for it (for the transfer tests);
- $HOSTILE_MEMBERS: meta.json's cluster members in the probe's replies become this JSON list.
Everything else passes through unchanged, line by line (a streaming probe keeps streaming).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

SENTINEL = "DFLASH-RESULT "


def _rewrite_run(run: dict) -> None:
    if os.environ.get("HOSTILE_RUN_ID") is not None:
        run["id"] = os.environ["HOSTILE_RUN_ID"]
    if os.environ.get("HOSTILE_MEMBERS") is not None and isinstance(run.get("meta"), dict):
        run["meta"]["cluster"] = {"name": "c", "members": json.loads(os.environ["HOSTILE_MEMBERS"])}


def rewrite(line: str) -> str:
    if not line.startswith(SENTINEL):
        return line
    frame = json.loads(line[len(SENTINEL):])
    doc = frame.get("doc") or {}
    if isinstance(doc.get("run"), dict):
        _rewrite_run(doc["run"])
    for run in doc.get("runs") or []:
        if isinstance(run, dict):
            _rewrite_run(run)
    return SENTINEL + json.dumps(frame) + "\n"


def _auto(spec: str) -> str:
    _, out, size = spec.split(":")
    os.makedirs(out, exist_ok=True)
    files = {}
    for name, data in (("config.json", b"{}\n"), ("model.safetensors", os.urandom(int(size)))):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return json.dumps({"out": out, "files": files, "reused": False})


def fake_export(argv: list[str]) -> int:
    reply = os.environ["HOSTILE_EXPORT"]
    if reply.startswith("auto:"):
        print(_auto(reply))
        return 0
    try:
        out = json.loads(reply).get("out")
    except (ValueError, AttributeError):
        out = None
    if isinstance(out, str) and out.startswith("/"):
        os.makedirs(out, exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            with open(os.path.join(out, name), "w") as f:
                f.write("{}\n")
    print(reply)
    return 0


def main(argv: list[str]) -> int:
    if "trainer.export" in argv and os.environ.get("HOSTILE_EXPORT") is not None:
        return fake_export(argv)
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(rewrite(line))
        sys.stdout.flush()
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
