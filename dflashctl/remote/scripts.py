"""Call a function of a stdlib-only module inside the target, with a JSON spec, in one round trip.

The module's source and the call travel on stdin (`python3 -`): the spec is embedded as a JSON
string literal produced by repr(), so no byte of it ever meets a shell. The reply is one framed
line `DFLASH-RESULT <json>`; anything else on stdout (banners) is ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflashctl.errors import DflashError, ExitCode
from dflashctl.remote.target import Target

RESULT_FRAME = "DFLASH-RESULT "
HERE = Path(__file__).parent


BUNDLE = "# probe:bundle"  # `from dflashctl.remote.probe.pieces.NAME import ...  # probe:bundle`


def module_source(name: str) -> str:
    """remote/<name>.py as it travels: each import line ending in BUNDLE is replaced by that probe piece's
    own source (once; its `# probe:strip` lines and `from __future__` dropped, as the probe's assembler does),
    so the programs that run in the container share one copy of the /proc helpers and the liveness rule."""
    out: list[str] = []
    seen: set[str] = set()
    in_import = False
    for line in (HERE / f"{name}.py").read_text().splitlines():
        if in_import:  # the names of a parenthesised bundled import
            in_import = ")" not in line
            continue
        if not line.rstrip().endswith(BUNDLE):
            out.append(line)
            continue
        in_import = line.split("#", 1)[0].rstrip().endswith("(")
        piece = line.split("pieces.", 1)[1].split()[0]
        if piece not in seen:
            seen.add(piece)
            out.append(f"# ---- bundled piece: {piece}")
            out += [ln for ln in (HERE / "probe" / "pieces" / f"{piece}.py").read_text().splitlines()
                    if not ln.rstrip().endswith("# probe:strip") and not ln.startswith("from __future__ import")]
    return "\n".join(out) + "\n"


def build_call(source: str, entry: str, spec: dict, *extra_args: str) -> str:
    spec_literal = repr(json.dumps(spec))
    extra = "".join(f", {a}" for a in extra_args)
    return f"{source}\n\nimport json as _json, sys as _sys\n_sys.exit({entry}(_json.loads({spec_literal}){extra}))\n"


def call(target: Target, module: str, entry: str, spec: dict, *, timeout: float | None = 120,
         pass_source: bool = False, data: bytes | None = None) -> dict:
    """Run `entry(spec)` from remote/<module>.py on the target and return its framed result.
    pass_source: also pass the module's own source (the launcher copies itself into the run dir).
    data: bytes for the function to read on stdin; the program then travels as `-c` (quoted once)."""
    source = module_source(module)
    extra = (repr(source),) if pass_source else ()
    program = build_call(source, entry, spec, *extra)
    if data is None:
        res = target.python(program, timeout=timeout)
    else:
        res = target.run([target.host.python, "-c", program], stdin=data, timeout=timeout)
    for line in reversed(res.out.splitlines()):
        idx = line.find(RESULT_FRAME)
        if idx >= 0:
            try:
                return json.loads(line[idx + len(RESULT_FRAME):])
            except ValueError:
                break
    hint = None
    if res.exit_code == 127:
        hint = f"is `{target.host.python}` installed in the target? set `python` for {target.host.name} in hosts.toml"
    raise DflashError(f"{module}.{entry} on {target.host.name} gave no result (exit {res.exit_code}): "
                      f"{res.tail() or 'no output'}", hint=hint, exit_code=ExitCode.CRASHED)
