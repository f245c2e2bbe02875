"""A host's own progress format (hosts.toml `progress_regex`) is read alike by `status`, `runs` and `logs --errors`,
and a bad `--progress-regex` is one line, exit 2."""

from __future__ import annotations

import pytest

from .conftest import wait_until

pytestmark = pytest.mark.timeout(120)

PROG = """\
import os, sys
for i in range(1, 4):
    print(f"it {i} of 40 | xent {4.0 / i:.3f}", flush=True)
open(os.path.join(os.environ["DFLASH_RUN_DIR"], "done"), "w").close()
raise SystemExit(0)
"""


def test_a_hosts_progress_regex_is_read_by_status_and_runs(local_host, cli, tmp_path, monkeypatch):
    hosts = tmp_path / "regex-hosts.toml"
    hosts.write_text(local_host.hosts_file.read_text()
                     + "progress_regex = 'it (?P<step>\\d+) of (?P<total>\\d+) \\| xent (?P<loss>[\\d.]+)'\n")
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(hosts))
    src = tmp_path / "src"
    src.mkdir()
    (src / "prog.py").write_text(PROG)
    launched = cli("launch", "--source", str(src), "--wait-for", "exit", "--json", "--exec", "--", "python3",
                   "prog.py")
    assert launched.code == 0, launched.err
    run_id = launched.json()["run_id"]
    wait_until(lambda: (local_host.workspace_dir / "runs" / run_id / "exit_code").exists(), what="exit code")
    status = cli("status", run_id, "--json").json()
    assert status["verdict"] == "finished"
    assert (status["progress"]["step"], status["progress"]["total"], status["progress"]["loss"]) == (3, 40, 1.333)
    [listed] = cli("runs", "--json").json()["runs"]
    assert listed["last_step"] == 3  # none of the known forms: only the host's regex finds it


def test_a_bad_progress_regex_on_the_command_line_is_one_line_exit_2(local_host, cli, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("it 1 of 40 | xent 4.0\n")
    for regex, problem in (("it (\\d+", "does not compile"), ("it \\d+", "none of the named groups")):
        res = cli("diagnose", str(log), "--progress-regex", regex)
        assert res.code == 2 and "Traceback" not in res.err, res.err
        first, *rest = res.err.strip().splitlines()
        assert first.startswith("ERROR: progress regex") and problem in first
        assert all(line.startswith("HINT:") for line in rest)
