"""The container programs (dflashctl/agent/): stdlib only, one copy of each rule, one reply framing."""

from __future__ import annotations

import ast
import collections
import subprocess
import sys
from pathlib import Path

import pytest

import dflashctl.agent
from dflashctl.agent.lib.frame import PROTOCOL_VERSION, SENTINEL, frame
from dflashctl.errors import DflashError
from dflashctl.remote import agentpack
from dflashctl.remote.agentcall import parse_replies

AGENT = Path(dflashctl.agent.__file__).parent


def _top_level_names(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


@pytest.mark.parametrize("path", sorted(AGENT.rglob("*.py")), ids=lambda p: str(p.relative_to(AGENT)))
def test_agent_modules_import_only_the_standard_library_and_each_other(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            mods = [node.module or ""]
        else:
            continue
        for mod in mods:
            top = mod.split(".")[0]
            assert mod.startswith("dflashctl.agent.") or (top in sys.stdlib_module_names and top != "dflashctl") \
                or (path.name == "gpus.py" and top == "pynvml"), f"{path}: imports {mod}"


def test_the_rules_are_defined_once_in_agent():
    defs = collections.Counter()
    for path in AGENT.rglob("*.py"):
        defs.update(f"{n}" for n in _top_level_names(ast.parse(path.read_text())))
    for name in ("MARKER", "SENTINEL", "liveness", "live_latest", "adopted_by", "proc_stat", "write_atomic",
                 "end_group", "reply"):
        assert defs[name] == 1, name


def test_replies_survive_banners_and_torn_lines_and_carry_the_protocol_version():
    line = frame({"a": 1})
    assert line.startswith(SENTINEL + " ") and f'"v": {PROTOCOL_VERSION}' in line
    text = f"Welcome\n{line}\n{frame({'a': 2})[:-5]}\nmotd {frame({'a': 3})}\n{SENTINEL} [1]\n"
    assert parse_replies(text.encode()) == [{"a": 1}, {"a": 3}]
    with pytest.raises(DflashError, match="protocol version 99"):
        parse_replies(f'{SENTINEL} {{"v": 99, "doc": {{}}}}\n')


def test_the_check_program_runs_on_a_bare_python(tmp_path):
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(agentpack.archive())
    res = subprocess.run([sys.executable, "-I", "-S", str(pyz), "check", str(tmp_path / "ws")], capture_output=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    (doc,) = parse_replies(res.stdout)
    assert doc["workspace"] == {"writable": True} and doc["python"].startswith("3.") and "free_bytes" in doc["disk"]
