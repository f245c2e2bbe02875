"""What a fresh `dflashctl` imports before it answers (issue 16: start fast), counted, never timed.

benchmarks/startup.py measures the seconds; these tests pin the causes: the console script's `version` imports
nothing but the package; `--help` is typer's own (no hand-made coercion, no cache: issue 25) and imports nothing a
verb needs; a local `status --json` no paramiko and none of the launch machinery.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# prints argv's output as the verb does, then the modules the interpreter holds, as a JSON line on stderr
_PROBE = ("import json, sys\nfrom dflashctl.cli import main\nrc = main(sys.argv[1:])\n"
          "sys.stderr.write('\\nMODULES ' + json.dumps({'rc': rc, 'modules': sorted(sys.modules)}) + '\\n')\n")

NEVER = ("paramiko", "cryptography", "invoke", "torch", "numpy")
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


def test_version_through_the_typer_app_imports_no_rich_no_transport_and_no_analysis() -> None:
    rc, out, mods = fresh("version")
    assert (rc, out) == (0, "0.1.0\n")
    assert loaded(mods, NEVER + ("rich",)) == []
    assert loaded(mods, OURS_HEAVY) == []
    assert "typer" in mods  # still typer's app that answered



def test_the_console_scripts_version_answers_before_typer_is_imported() -> None:
    """The installed `dflashctl` (pyproject's entry point, dflashctl/entry.py) prints the version with nothing but
    the package itself; any other command line, `--help` included, goes to the typer app."""
    code = ("import json, sys\nsys.argv = ['dflashctl', *sys.argv[1:]]\nfrom dflashctl.entry import main\n"
            "rc = main()\nsys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n")
    for argv, typer_loaded in ((["version"], False), (["version", "--help"], True), (["--help"], True),
                               (["logs", "--errors"], True)):
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
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


@pytest.mark.parametrize("verb", ["launch", "status", "logs", "deploy", "hosts check"])
def test_a_verbs_help_is_typers_with_no_python_types_on_its_options(verb: str) -> None:
    """typer (0.29) would print `<bool>` on every flag and `<str>` on a valued option without a metavar: a flag
    shows no value, a valued option its name (cli/__init__.py plain_metavars); the rest is typer's rendering."""
    env = {**os.environ, "COLUMNS": "200", "TERMINAL_WIDTH": "200", "NO_COLOR": "1"}
    p = subprocess.run([sys.executable, "-m", "dflashctl", *verb.split(), "--help"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0 and f"Usage: dflashctl {verb} [OPTIONS]" in p.stdout, p.stdout + p.stderr
    options = p.stdout[p.stdout.index("Options"):]
    assert "<bool>" not in options and "<str>" not in options and "<int>" not in options, options
    assert "--json" in options and "--help" in options and "Show this message and exit." in options


def test_typer_coerces_and_refuses_bad_values_itself() -> None:
    rc, _, _ = fresh("logs", "--lines", "many")  # a bad value: typer's own message, exit 2
    assert rc == 2
    p = subprocess.run([sys.executable, "-m", "dflashctl", "logs", "--lines", "many"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "Invalid value for '--lines'" in p.stderr and "Traceback" not in p.stderr


def test_local_status_json_takes_no_paramiko(tmp_path: Path) -> None:
    (tmp_path / "hosts.toml").write_text('default = "here"\n[hosts.here]\ntransport = "local"\nworkspace = "ws"\n')
    rc, out, mods = fresh("status", "--json", "--hosts", str(tmp_path / "hosts.toml"), "-i", "2", cwd=tmp_path)
    assert rc == 102, out  # no run yet: the documented "not found" code, after the real local probe
    assert loaded(mods, ("paramiko", "cryptography")) == []
    assert "dflashctl.commands.status" in mods



def test_status_of_a_finished_run_loads_none_of_the_launch_or_cluster_machinery(tmp_path: Path) -> None:
    hosts = _finished_run(tmp_path)
    rc, out, mods = fresh("status", "--json", "--hosts", str(hosts), cwd=tmp_path)
    assert rc == 0 and json.loads(out)["verdict"] == "finished", out
    assert loaded(mods, ("dflashctl.commands.launch", "dflashctl.commands.cluster", "dflashctl.commands.cluster_runs",
                         "dflashctl.commands.deploy", "paramiko")) == []


def _finished_run(tmp_path: Path) -> Path:
    run = tmp_path / "ws" / "runs" / "20261201-120000-done"
    run.mkdir(parents=True)
    (run / "meta.json").write_text('{"id": "20261201-120000-done", "name": "done"}')
    (run / "train.log").write_text("step=1 loss=1.0 tok/s=10.0\ntraining finished\n")
    (run / "exit_code").write_text("0\n")
    (run.parent / "latest").symlink_to(run.name)
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('default = "here"\n[hosts.here]\ntransport = "local"\nworkspace = "ws"\n')
    return hosts


def _console(*argv: str, cwd: Path) -> tuple[int, str, str, set[str]]:
    """The installed console script (dflashctl/entry.py) in a new interpreter: exit, stdout, stderr, modules."""
    code = ("import json, sys\nsys.argv = ['dflashctl', *sys.argv[1:]]\nfrom dflashctl.entry import main\n"
            "rc = main()\nsys.stderr.write('\\nMODULES ' + json.dumps({'rc': rc, 'modules': sorted(sys.modules)})"
            " + '\\n')\n")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=cwd)
    head, _, tail = p.stderr.rpartition("\nMODULES ")
    doc = json.loads(tail)
    return doc["rc"], p.stdout, head, set(doc["modules"])


def _same_but_time(a: str, b: str) -> tuple[dict, dict]:
    """Two `status --json` documents without the fields that tell when they were read."""
    def strip(doc: dict) -> dict:
        return {k: v for k, v in doc.items() if k not in ("time", "probe_time", "age_s")}
    return strip(json.loads(a)), strip(json.loads(b))


def test_the_console_scripts_one_shot_status_answers_before_typer_with_the_typer_verbs_output(tmp_path: Path) -> None:
    """`status --json` of the plain shape (cli/statusonce.py) is answered without typer or pydantic (typer's
    coercion imports it: about half a one-shot status's laptop CPU), with the same document and exit code the typer
    verb gives for the same command line, and the same one-line error for a host that is not in hosts.toml."""
    hosts = _finished_run(tmp_path)
    for argv in (["status", "--json", "--hosts", str(hosts)], ["status", "latest", f"--hosts={hosts}", "--json"],
                 ["status", "--json", "-H", "here", "--hosts", str(hosts)]):
        rc, out, _, mods = _console(*argv, cwd=tmp_path)
        assert rc == 0 and json.loads(out)["verdict"] == "finished", (argv, out)
        assert loaded(mods, ("typer", "pydantic", "pydantic_core", "click", "rich")) == [], argv
        trc, tout, _ = fresh(*argv, cwd=tmp_path)
        assert trc == rc
        mine, typers = _same_but_time(out, tout)
        assert mine.keys() == typers.keys() and mine["verdict"] == typers["verdict"] and mine["run"] == typers["run"]
    rc, out, err, mods = _console("status", "--json", "--host", "nope", "--hosts", str(hosts), cwd=tmp_path)
    assert rc == 2 and out == "" and err.startswith("ERROR: unknown host 'nope'") and "Traceback" not in err
    assert "typer" not in mods
    trc, tout, _ = fresh("status", "--json", "--host", "nope", "--hosts", str(hosts), cwd=tmp_path)
    assert (trc, tout) == (rc, out)


def test_the_table_of_a_one_shot_status_is_the_typer_verbs_table(tmp_path: Path) -> None:
    hosts = _finished_run(tmp_path)
    rc, out, _, mods = _console("status", "--hosts", str(hosts), cwd=tmp_path)
    trc, tout, _ = fresh("status", "--hosts", str(hosts), cwd=tmp_path)
    assert rc == trc == 0 and "typer" not in mods and "20261201-120000-done" in out
    strip = lambda s: [ln for ln in s.splitlines() if " ago" not in ln and "age" not in ln]  # noqa: E731
    assert strip(out) == strip(tout)


@pytest.mark.parametrize("argv", [["status", "--watch"], ["status", "--help"], ["status", "--json", "--json"],
                                  ["status", "--host="], ["status", "--host"], ["status", "a", "b"],
                                  ["status", "--", "x"], ["status", "--all"], ["status", "-w"],
                                  ["status", "--host", "--json"], ["status", "--hots", "x"], ["status", "-H=pve"],
                                  ["status", "-Hpve"], ["status", "--json=1"], ["status", "-"]])
def test_every_other_status_command_line_is_typers_to_parse(argv: list[str], tmp_path: Path) -> None:
    """Help, --watch, a repeated or missing value, a second RUN, `--`, a typo: typer parses, explains and refuses,
    as for every verb (the plain shape only skips typer's start)."""
    from dflashctl.cli.statusonce import parse

    assert parse(argv[1:]) is None
    _, _, _, mods = _console(*argv, "--hosts", str(tmp_path / "none.toml"), cwd=tmp_path)
    assert "typer" in mods


def test_the_plain_shapes_values_are_typers() -> None:
    from dflashctl.cli.statusonce import OneShot, parse

    assert parse([]) == OneShot()
    assert parse(["r1", "--json", "--events", "-H", "pve", "--hosts=h.toml"]) == \
        OneShot("r1", Path("h.toml"), "pve", True, True)
    assert parse(["--host=a,b", "r2"]) == OneShot("r2", None, "a,b")
