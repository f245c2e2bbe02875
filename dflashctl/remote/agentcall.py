"""Run a verb of the agent archive on a target: `PYTHON -c BOOT <path> VERB [ARGS]`, installing the archive first
only where it is missing. The one way code reaches the container (and the Proxmox host).

The archive (remote/agentpack.py) lives at `<workspace>/.agent/<sha256>.pyz` in the container, and for what runs on the
Proxmox host itself (Target.run_host: the host half of status, `gpus`, `hosts check`) at
`~/.cache/dflashctl/agent/<sha256>.pyz` there. BOOT, a few lines sent with every call, runs it only when its folder is
ours alone, every folder above it root's or ours and writable by nobody else unless sticky (agentinstall's
parents_problem, the same rule), and the file's trailer hash holds (agent/agentinstall.py writes it), else prints
MISSING and exits MISSING_EXIT; then the archive goes once on stdin to the installer and the call is made again. Specs
travel as one JSON line on stdin, never in argv (a launch spec carries --env values). Each program replies with ONE line
`<SENTINEL> {"v": 1, "doc": {...}}` (agent/lib/frame.py); parse_replies is the one reader of it, and anything else on
stdout (login banners, locale warnings) is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from dflashctl.agent import agentinstall
from dflashctl.agent.lib.frame import PROTOCOL_VERSION, SENTINEL
from dflashctl.errors import RemoteFailed
from dflashctl.remote import agentpack
from dflashctl.remote.target import Target
from dflashctl.remote.transport import Result

MISSING = "DFLASH-AGENT-MISSING"
MISSING_EXIT = 93
HOST_FOLDER = "~/.cache/dflashctl/agent"
# Any Python 3. The C sha256 itself where there is one: hashlib's import loads OpenSSL (~3 ms of every call).
BOOT = f"""import os, stat, sys
p = os.path.expanduser(sys.argv[1])
try:
    from _sha256 import sha256
except ImportError:
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256
try:
    s = os.lstat(os.path.dirname(p))
    ok = stat.S_ISDIR(s.st_mode) and s.st_uid == os.getuid() and not s.st_mode & 0o022
    q = os.path.realpath(os.path.dirname(p))
    while ok and q != "/":
        q = os.path.dirname(q)
        s = os.stat(q)
        ok = s.st_uid in (0, os.getuid()) and (not s.st_mode & 0o022 or s.st_mode & stat.S_ISVTX)
    with open(p, "rb") as f:
        d = f.read()
    ok = ok and d[-77:-64] == {agentinstall.TAG!r} and sha256(d[:-77]).hexdigest().encode() == d[-64:]
except OSError:
    ok = False
if not ok:
    print({MISSING!r}, flush=True)
    sys.exit({MISSING_EXIT})
del d
sys.argv = sys.argv[1:]
sys.argv[0] = p
sys.path.insert(0, p)
from dflashctl.agent.verbs import main
sys.exit(main(sys.argv[1:], p))
"""


@lru_cache(maxsize=1)
def installer_source() -> str:
    return Path(agentinstall.__file__).read_text()


def folder(target: Target, on_host: bool = False) -> str:
    return HOST_FOLDER if on_host else f"{target.host.workspace.rstrip('/')}/.agent"


def path(target: Target, on_host: bool = False) -> str:
    """Where the archive is installed on the target (on_host: on the Proxmox host, outside the container)."""
    return f"{folder(target, on_host)}/{agentpack.sha256()}.pyz"


def python(target: Target, on_host: bool = False) -> str:
    return "python3" if on_host else target.host.python


def argv(target: Target, verb: str, *args: str, on_host: bool = False) -> list[str]:
    """The command line of one call (with no install): for benchmarks and tests that run it by hand."""
    return [python(target, on_host), "-c", BOOT, path(target, on_host), verb, *args]


def _run(target: Target, argv: list[str], stdin: bytes | None, timeout: float | None, on_host: bool) -> Result:
    return (target.run_host if on_host else target.run)(argv, stdin=stdin, timeout=timeout)


def missing(res: Result) -> bool:
    return res.exit_code == MISSING_EXIT and MISSING.encode() in res.stdout


def host_half_on_proxmox(target: Target) -> bool:
    """Whether what reads the GPU host itself (its kernel log, the driver's processes) runs on the Proxmox host,
    outside the container (on_host=True), rather than on the machine the target is."""
    return target.host.container is not None


def where(target: Target, on_host: bool) -> str:
    """The machine a call ran on, for a message."""
    return "the Proxmox host" if on_host else target.host.name


def _no_python_hint(target: Target, on_host: bool) -> str:
    """The hint for exit 127: the interpreter is not there."""
    return f"is `{python(target, on_host)}` installed there? set `python` for {target.host.name} in hosts.toml"


def _refused(target: Target, on_host: bool, res: Result) -> RemoteFailed | None:
    """None when the installer said ok; else its refusal as one line."""
    said = [ln for ln in res.out.splitlines() if ln.startswith("DFLASH-AGENT-INSTALL ")]
    if res.exit_code == 0 and said and said[-1].split()[1] == "ok":
        return None
    why = said[-1].split(" ", 1)[1] if said else f"exit {res.exit_code}: {res.tail() or 'no output'}"
    hint = _no_python_hint(target, on_host) if res.exit_code == 127 else \
        f"remove or fix {folder(target, on_host)} on {where(target, on_host)} (it and every folder above it must " \
        "belong to the user dflashctl runs as or root, writable by nobody else)"
    return RemoteFailed(f"installing dflashctl's agent on {where(target, on_host)}: {why}", hint=hint)


def install(target: Target, on_host: bool = False, timeout: float | None = 120) -> None:
    """Send the archive to the installer (agent/agentinstall.py); RemoteFailed in one line when it refused."""
    res = _run(target, [python(target, on_host), "-c", installer_source(), folder(target, on_host),
                        agentpack.sha256()], agentpack.archive(), timeout, on_host)
    error = _refused(target, on_host, res)
    if error is not None:
        raise error


def _not_run_after_install(target: Target, on_host: bool) -> RemoteFailed:
    return RemoteFailed(f"dflashctl's agent on {where(target, on_host)} was installed at {path(target, on_host)} "
                        "but does not pass the bootstrap's check", hint="is something rewriting that folder?")


def run(target: Target, verb: str, *args: str, stdin: bytes | None = None, timeout: float | None = 120,
        on_host: bool = False, private_fallback: bool = False) -> Result:
    """One call of verb; the archive installed first when the target lacks it (then the call is made again).
    private_fallback (an argv verb): where the install is refused, run it once from a temporary install that is
    removed after it (agentinstall --private), so `hosts check` still reports a workspace it cannot use."""
    cmd = argv(target, verb, *args, on_host=on_host)
    res = _run(target, cmd, stdin, timeout, on_host)
    if missing(res):
        try:
            install(target, on_host, timeout)
        except RemoteFailed:
            if not private_fallback:
                raise
            return _run(target, [python(target, on_host), "-c", installer_source(), "--private", agentpack.sha256(),
                                 verb, *args], agentpack.archive(), timeout, on_host)
        res = _run(target, cmd, stdin, timeout, on_host)
        if missing(res):  # installed, yet the bootstrap will not run it: say so, not "printed no report"
            raise _not_run_after_install(target, on_host)
    return res


def stream(target: Target, verb: str, *args: str, on_host: bool = False) -> Iterator[bytes]:
    """stdout lines of a long-running verb (a watch), installing the archive first where it is missing. Close the
    iterator to end the command."""
    cmd = argv(target, verb, *args, on_host=on_host)
    for attempt in (1, 2):
        lines = target.transport.stream(cmd) if on_host else target.stream(cmd)
        try:
            for line in lines:
                if line.strip() == MISSING.encode():
                    if attempt == 2:
                        raise _not_run_after_install(target, on_host)
                    break
                yield line
            else:
                return
        finally:
            close = getattr(lines, "close", None)
            if close is not None:
                close()
        install(target, on_host)


def call(target: Target, verb: str, spec: dict, *, data: bytes = b"", timeout: float | None = 120) -> dict:
    """Run a spec verb (agent/verbs.py) in the container and return its reply's doc. The spec goes as the first line
    of stdin, data after it (what the program reads itself)."""
    res = run(target, verb, stdin=json.dumps(spec).encode() + b"\n" + data, timeout=timeout)
    docs = parse_replies(res.out)
    if docs:
        return docs[-1]
    hint = _no_python_hint(target, False) if res.exit_code == 127 else None
    raise RemoteFailed(f"{verb} on {target.host.name} gave no result (exit {res.exit_code}): "
                       f"{res.tail() or 'no output'}", hint=hint)


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
                          hint="the agent archive is named by its content; is an old dflashctl on PATH?")
    doc = frame.get("doc")
    return doc if isinstance(doc, dict) else None


def parse_replies(text: str | bytes) -> list[dict]:
    """Every reply's doc in text, in order."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [doc for doc in map(parse_reply, text.splitlines()) if doc is not None]
