"""One JSON shape of a run: `status --json` (its `run`) and `runs --json` (each run) carry the same keys, and agree
on what both know (report.RunRecord.to_record is the one writer). Real launch, real probe, local host."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import wait_until

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

PROG = """\
for i in range(1, 4):
    print(f"step={i} loss={4.0 / i:.3f}", flush=True)
"""


def test_status_and_runs_print_a_run_in_one_shape(local_host, cli, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "prog.py").write_text(PROG)
    launched = cli("launch", "--source", str(src), "--name", "shape", "--wait-for", "exit", "--json", "--exec", "--",
                   "python3", "prog.py")
    assert launched.code == 0, launched.err
    run_id = launched.json()["run_id"]
    wait_until(lambda: (local_host.workspace_dir / "runs" / run_id / "exit_code").exists(), what="exit code")
    by_status = cli("status", run_id, "--json").json()["run"]
    [by_runs] = cli("runs", "--json").json()["runs"]
    assert list(by_status) == list(by_runs)
    same = ("id", "name", "kind", "dir", "log_path", "pid", "alive", "exit_code", "stopped", "verdict", "started_at",
            "last_step", "attempt", "restart_of")
    assert {k: by_status[k] for k in same} == {k: by_runs[k] for k in same}
    assert (by_runs["id"], by_runs["name"], by_runs["kind"], by_runs["verdict"], by_runs["last_step"]) == (
        run_id, "shape", "exec", "finished", 3)


def test_no_record_method_has_another_name() -> None:
    """A record as JSON is `to_record` everywhere in dflashctl (not to_json, to_dict, as_dict)."""
    other = []
    for path in sorted((REPO / "dflashctl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                other += [f"{path.relative_to(REPO)}:{f.lineno} {node.name}.{f.name}" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name in ("to_json", "to_dict", "as_dict", "to_doc")]
    assert other == []
