"""The reply: every container program answers with ONE line `<SENTINEL> {"v": 1, "doc": {...}}`.

`doc` is the program's own result (its fields are the contract with the command that reads it); `v` is the
framing protocol's version. Anything else the program or the login prints on stdout is ignored by the one
laptop-side parser (`dflashctl.remote.agentcall.parse_replies`). This module runs under any Python 3: the hosts
check imports it and must report an old interpreter rather than fail on one.
"""

import json
import sys

SENTINEL = "DFLASH-RESULT"
PROTOCOL_VERSION = 1
# the probe report's own version (its fields are the contract with report.py, which refuses another one)
PROBE_VERSION = 1


def frame(doc):
    """The reply line for doc (a dict), without the newline."""
    return SENTINEL + " " + json.dumps({"v": PROTOCOL_VERSION, "doc": doc})


def reply(doc, code=0):
    """Print doc's reply line, flush, and return code (the program's exit status)."""
    sys.stdout.write(frame(doc) + "\n")
    sys.stdout.flush()
    return code


def emit(doc):
    """reply(doc) with the agent's exit status: 1 when doc is a refusal ({"error": ...}), else 0."""
    return reply(doc, 0 if "error" not in doc else 1)
