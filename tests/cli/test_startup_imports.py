"""What a fresh `dflashctl` imports before it answers (issue 16: start fast), counted, never timed.

benchmarks/startup.py measures the seconds; these tests pin the causes: `version` imports no rich, no pydantic, no
transport and no analysis module; `--help` only what typer's rich help needs; a local `status --json` no pydantic and
no paramiko. The lean coercion that keeps pydantic out (cli/coerce.py) must give exactly what typer's gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer._click.exceptions import BadParameter

from dflashctl.cli import coerce

# prints argv's output as the verb does, then the modules the interpreter holds, as a JSON line on stderr
_PROBE = ("import json, sys\nfrom dflashctl.cli import main\nrc = main(sys.argv[1:])\n"
          "sys.stderr.write('\\nMODULES ' + json.dumps({'rc': rc, 'modules': sorted(sys.modules)}) + '\\n')\n")

NEVER = ("pydantic", "pydantic_core", "typer._adapters", "paramiko", "cryptography", "invoke", "torch", "numpy")
OURS_HEAVY = ("dflashctl.analysis", "dflashctl.commands", "dflashctl.remote", "dflashctl.config", "dflashctl.model",
              "dflashctl.report", "dflashctl.sentinel", "dflashctl.agent", "dflashctl.cli.statusview",
              "dflashctl.cli.timeline", "dflashctl.cli.gpuhealth")


def fresh(*argv: str, cwd: Path | None = None) -> tuple[int, str, set[str]]:
    """Run the console script's main in a new interpreter: exit code, stdout, modules imported by the end."""
    p = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120, cwd=cwd)
    line = next((ln for ln in p.stderr.splitlines() if ln.startswith("MODULES ")), None)
    assert line is not None, p.stderr[-2000:]
    doc = json.loads(line.removeprefix("MODULES "))
    return doc["rc"], p.stdout, set(doc["modules"])


def loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_version_imports_no_rich_no_pydantic_no_transport_and_no_analysis() -> None:
    rc, out, mods = fresh("version")
    assert (rc, out) == (0, "0.1.0\n")
    assert loaded(mods, NEVER + ("rich",)) == []
    assert loaded(mods, OURS_HEAVY) == []
    assert "typer" in mods  # still typer's app that answered



def test_the_console_scripts_version_answers_before_typer_is_imported() -> None:
    """The installed `dflashctl` (pyproject's entry point, dflashctl/entry.py) prints the version with nothing but
    the package itself; any other command line still goes to the typer app."""
    code = ("import json, sys\nsys.argv = ['dflashctl', *sys.argv[1:]]\nfrom dflashctl.entry import main\n"
            "rc = main()\nsys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n")
    env = {**os.environ, "DFLASHCTL_NO_HELP_CACHE": "1"}  # `--help` from the cache: tests/cli/test_help_cache.py
    for argv, typer_loaded in ((["version"], False), (["version", "--help"], True), (["logs", "--errors"], True)):
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, env=env)
        mods = set(json.loads(next(ln for ln in p.stderr.splitlines() if ln.startswith("MODULES "))[8:]))
        assert ("typer" in mods) is typer_loaded, argv
        if not typer_loaded:
            assert p.stdout == "0.1.0\n" and loaded(mods, ("dflashctl",)) == ["dflashctl", "dflashctl.entry"]

def test_help_imports_typers_rich_help_and_nothing_a_verb_needs() -> None:
    rc, out, mods = fresh("--help")
    assert rc == 0 and "Usage: dflashctl" in out and "status" in out and "--install-completion" in out
    assert loaded(mods, NEVER) == []
    assert loaded(mods, OURS_HEAVY) == []
    # typer.rich_utils itself imports rich's table, panel, markdown, syntax and traceback; the watch's pieces stay out
    assert loaded(mods, ("rich.live", "rich.progress", "rich.prompt")) == []


def test_a_verbs_help_stays_off_pydantic_and_a_bad_value_gets_typers_own_coercion() -> None:
    rc, out, mods = fresh("status", "--help")
    assert rc == 0 and "--interval" in out and loaded(mods, NEVER) == []
    rc, _, mods = fresh("logs", "--lines", "many")  # a bad value: typer's own (pydantic) message, exit 2
    assert rc == 2 and "pydantic" in mods


def test_local_status_json_takes_no_pydantic_and_no_paramiko(tmp_path: Path) -> None:
    (tmp_path / "hosts.toml").write_text('default = "here"\n[hosts.here]\ntransport = "local"\nworkspace = "ws"\n')
    rc, out, mods = fresh("status", "--json", "--hosts", str(tmp_path / "hosts.toml"), "-i", "2", cwd=tmp_path)
    assert rc == 102, out  # no run yet: the documented "not found" code, after the real local probe
    assert loaded(mods, ("pydantic", "paramiko", "cryptography", "typer._adapters")) == []
    assert "dflashctl.commands.status" in mods



def test_status_of_a_finished_run_loads_none_of_the_launch_or_cluster_machinery(tmp_path: Path) -> None:
    run = tmp_path / "ws" / "runs" / "20261201-120000-done"
    run.mkdir(parents=True)
    (run / "meta.json").write_text('{"id": "20261201-120000-done", "name": "done"}')
    (run / "train.log").write_text("step=1 loss=1.0 tok/s=10.0\ntraining finished\n")
    (run / "exit_code").write_text("0\n")
    (run.parent / "latest").symlink_to(run.name)
    (tmp_path / "hosts.toml").write_text('default = "here"\n[hosts.here]\ntransport = "local"\nworkspace = "ws"\n')
    rc, out, mods = fresh("status", "--json", "--hosts", str(tmp_path / "hosts.toml"), cwd=tmp_path)
    assert rc == 0 and json.loads(out)["verdict"] == "finished", out
    assert loaded(mods, ("dflashctl.commands.launch", "dflashctl.commands.cluster", "dflashctl.commands.cluster_runs",
                         "dflashctl.commands.deploy", "pydantic", "paramiko")) == []

# --- the lean coercion is typer's coercion, value for value -----------------------------------------------------

def _typer_and_lean(annotation: Any, **info: Any) -> tuple[Any, Any]:
    from typer._coercion import build_runtime_param, resolve_type_descriptor
    from typer.models import OptionInfo

    d = resolve_type_descriptor(annotation, OptionInfo(**info))
    return build_runtime_param(d), coerce.LeanParam(parameter_info=d.parameter_info, annotation=annotation,
                                                    descriptor=d)


def _outcome(rp: Any, value: Any) -> tuple[str, Any]:
    try:
        got = rp._coerce_value(value, param=None, ctx=None)
    except BadParameter as e:
        return "error", e.format_message()
    return type(got).__name__, repr(got)  # repr: nan == nan


CASES: list[tuple[Any, dict[str, Any], list[Any]]] = [
    (bool, {}, [True, False, "true", "no", "1", "x"]),
    (str, {}, ["", "run-1", "ü", b"bytes"]),
    (int, {}, ["0", "7", "-3", "007", "+4", " 5", "1_000", "1.5", "x", "9" * 30, 12]),
    (int, {"min": 1, "max": 9}, ["1", "9", "0", "10"]),
    (float, {}, ["1", "1.5", "-0.25", "1e3", ".5", "inf", "nan", "x", 3, 2.5]),
    (float, {"min": 0.1, "max": 3600}, ["0.1", "3600", "0.05", "3600.5", 1.0, 2]),
    (float, {"min": 0.1, "clamp": True}, ["0.01", "5"]),
    (Path, {}, ["hosts.toml", "/nonexistent/x", "", "~/x", Path("p")]),
    (Path, {"exists": True}, ["/nonexistent/x", "/"]),
    (Path, {"dir_okay": False}, ["/"]),
    (list[str], {}, [["a", "b"], []]),
    (list[int], {}, [["1", "2"], ["1", "x"]]),
    (list[Path], {}, [["a", "/b"]]),
]


@pytest.mark.parametrize(("annotation", "info", "values"), CASES, ids=lambda x: repr(x)[:30])
def test_lean_coercion_gives_exactly_what_typers_pydantic_coercion_gives(annotation: Any, info: dict[str, Any],
                                                                         values: list[Any]) -> None:
    typer_rp, lean_rp = _typer_and_lean(annotation, **info)
    for v in values:
        assert _outcome(lean_rp, v) == _outcome(typer_rp, v), v


def test_every_parameter_of_the_app_gets_the_lean_coercion() -> None:
    from typer.main import get_command

    from dflashctl.cli import app

    command = get_command(app)
    n = coerce.install(command)
    params = [p for c in _walk(command) for p in c.params]
    assert n > len(params)  # each command's --help too
    assert all(isinstance(p._runtime_param, coerce.LeanParam) for p in params)
    assert coerce.install(command) == 0  # installed once; typer's own cache is then used


def _walk(cmd: Any) -> list[Any]:
    return [cmd, *(c for sub in getattr(cmd, "commands", {}).values() for c in _walk(sub))]

