"""The agent archive's verbs: `python3 <archive> VERB [ARGS]` runs one container program (stdlib only).

One table says what each verb runs, so the laptop (remote/agentpack.py) computes the archive's contents from it and
every program is reached the same way. Two shapes: an argv verb takes its arguments as given (the probe keeps its
ProbeRequest.to_argv contract); a spec verb reads its spec as ONE JSON line on stdin (never argv: a launch spec carries
--env values) and leaves the rest of stdin to the program (`code-install` reads its tar there). Each module is
imported only when its verb runs, so a probe loads none of the launcher. Written for any Python 3: `hosts check`
must report an old interpreter, not fail on this file.
"""

import importlib
import json
import sys

USAGE = 2
# verb -> (module below dflashctl, function, "argv" | "spec" | "archive": the spec and this archive's path)
VERBS = {
    "probe": ("agent.probe.main", "main", "argv"),
    "hostpair": ("agent.hostpair", "main", "argv"),
    "hostgpus": ("agent.probe.hostgpus", "main", "argv"),
    "hostcheck": ("agent.hostcheck", "main", "argv"),
    "check": ("agent.check", "main", "argv"),
    "supervise": ("agent.launcher", "supervise_main", "argv"),
    "launch": ("agent.launcher", "launch", "archive"),
    "adopt": ("agent.lib.adoption", "adopt", "spec"),
    "stop": ("agent.reaper", "stop", "spec"),
    "kill": ("agent.reaper", "kill", "spec"),
    "mark": ("agent.reaper", "mark", "spec"),
    "stacks": ("agent.stacks", "main", "spec"),
    "code-state": ("agent.codetree", "state", "spec"),
    "code-install": ("agent.codetree", "install", "spec"),
    "sentinel": ("sentinel.main", "main", "argv"),
}


def read_spec() -> dict:
    """The spec: the first line of stdin (the bytes after it are the program's own input)."""
    line = sys.stdin.buffer.readline()
    spec = json.loads(line.decode("utf-8")) if line.strip() else {}
    if not isinstance(spec, dict):
        raise ValueError("the spec on stdin is not a JSON object")
    return spec


def main(argv: list, archive: str) -> int:
    """Run argv[0]'s program; archive: the path this archive was run from (the launcher copies it into the run)."""
    if not argv or argv[0] not in VERBS:
        sys.stderr.write("usage: python3 AGENT.pyz {{{}}} [ARGS]\n".format(",".join(sorted(VERBS))))
        return USAGE
    module, function, shape = VERBS[argv[0]]
    entry = getattr(importlib.import_module("dflashctl." + module), function)
    if shape == "argv":
        return entry(argv[1:])
    try:
        spec = read_spec()
    except ValueError as e:
        sys.stderr.write(f"{argv[0]}: {e}\n")
        return USAGE
    return entry(spec, archive) if shape == "archive" else entry(spec)
