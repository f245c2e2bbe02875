"""The laptop side of the container programs (dflashctl/agent/): assemble one, send it, read its reply.

A program is `agent/<name>.py` with every `from dflashctl.agent.X import ...` line (top level) replaced by
module X's own source, recursively and once each (module_source), so it travels as one stdlib-only file on
stdin (`python3 -`) and every program holds one copy of each rule in agent/lib. A call's spec is embedded as
a JSON string literal produced by repr(), so no byte of it ever meets a shell. Each program replies with ONE
line `<SENTINEL> {"v": 1, "doc": {...}}` (agent/lib/frame.py); parse_replies is the one reader of it, and
anything else on stdout (login banners, locale warnings) is ignored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import dflashctl.agent
from dflashctl.agent.lib.frame import PROTOCOL_VERSION, SENTINEL
from dflashctl.errors import DflashError, ExitCode, RemoteFailed
from dflashctl.remote.target import Target

AGENT_DIR = Path(dflashctl.agent.__file__).parent  # the sources are read from the installed package
_PREFIX = "from dflashctl.agent."
_OTHER_IMPORT = re.compile(r"^\s*(from|import)\s+dflashctl\b")
_FUTURE = "from __future__ import annotations"


def module_source(name: str) -> str:
    """agent/<name>.py as it travels (name dotted below agent: "launcher", "probe.main"): one file, its
    dflashctl.agent imports pasted in where they stood (their `from __future__` lines dropped; one goes on top
    when any module had it, where Python requires it)."""
    body: list[str] = []
    future = _paste(name, set(), body)
    return "\n".join(([_FUTURE] if future else []) + body) + "\n"


def _paste(name: str, seen: set[str], out: list[str]) -> bool:
    """Append module name's lines to out, its agent imports replaced by their modules; True if any of them
    used `from __future__ import annotations`."""
    seen.add(name)
    future = False
    lines = (AGENT_DIR / Path(*name.split("."))).with_suffix(".py").read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("from __future__ import"):
            future = True
            continue
        if line.startswith(_PREFIX):
            code = line.split("#", 1)[0]
            if "(" in code and ")" not in code:  # the names of a parenthesised import, up to its `)`
                while i < len(lines) and ")" not in lines[i]:
                    i += 1
                i += 1
            dep = line[len(_PREFIX):].split()[0]
            if dep not in seen:
                out.append(f"# ---- agent/{dep.replace('.', '/')}.py")
                future |= _paste(dep, seen, out)
                out.append(f"# ---- agent/{name.replace('.', '/')}.py")
            continue
        if _OTHER_IMPORT.match(line):
            raise ValueError(f"agent/{name}: {line.strip()!r} cannot travel (only top-level `{_PREFIX}X import` does)")
        out.append(line)
    return future


def parse_reply(line: str) -> dict | None:
    """The doc of one framed reply line (the sentinel may follow junk on the same line); None for any other
    line, a torn one among them. A reply of another protocol version is refused."""
    idx = line.find(SENTINEL + " ")
    if idx < 0:
        return None
    try:
        frame = json.loads(line[idx + len(SENTINEL) + 1:])
    except ValueError:
        return None
    if not isinstance(frame, dict):
        return None
    if frame.get("v") != PROTOCOL_VERSION:
        raise RemoteFailed(f"reply protocol version {frame.get('v')!r} does not match this CLI ({PROTOCOL_VERSION})",
                          hint="the container programs are sent with every command; is an old dflashctl on PATH?")
    doc = frame.get("doc")
    return doc if isinstance(doc, dict) else None


def parse_replies(text: str | bytes) -> list[dict]:
    """Every reply's doc in text, in order."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [doc for doc in map(parse_reply, text.splitlines()) if doc is not None]


def build_call(source: str, entry: str, spec: dict, *extra_args: str) -> str:
    spec_literal = repr(json.dumps(spec))
    extra = "".join(f", {a}" for a in extra_args)
    return f"{source}\n\nimport json as _json, sys as _sys\n_sys.exit({entry}(_json.loads({spec_literal}){extra}))\n"


def call(target: Target, module: str, entry: str, spec: dict, *, timeout: float | None = 120,
         pass_source: bool = False, data: bytes | None = None) -> dict:
    """Run `entry(spec)` from agent/<module>.py on the target and return its reply's doc.
    pass_source: also pass the module's own source (the launcher copies itself into the run dir).
    data: bytes for the function to read on stdin; the program then travels as `-c` (quoted once)."""
    source = module_source(module)
    extra = (repr(source),) if pass_source else ()
    program = build_call(source, entry, spec, *extra)
    if data is None:
        res = target.python(program, timeout=timeout)
    else:
        res = target.run([target.host.python, "-c", program], stdin=data, timeout=timeout)
    docs = parse_replies(res.out)
    if docs:
        return docs[-1]
    hint = None
    if res.exit_code == 127:
        hint = f"is `{target.host.python}` installed in the target? set `python` for {target.host.name} in hosts.toml"
    raise DflashError(f"{module}.{entry} on {target.host.name} gave no result (exit {res.exit_code}): "
                      f"{res.tail() or 'no output'}", hint=hint, exit_code=ExitCode.CRASHED)
