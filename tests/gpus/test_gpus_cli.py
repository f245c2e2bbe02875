"""`gpus` at the CLI boundary: bad options are one line and exit 2; a machine without GPUs says so; --watch --json is
one JSON document per reading."""

from __future__ import annotations

import json

import pytest

from dflashctl.cli import main


@pytest.mark.parametrize(("argv", "says"), [
    (["gpus", "--interval", "0"], "--interval must be a number from 0.1 to 3600 s, not 0.0"),
    (["gpus", "--watch", "--count", "0"], "--count must be at least 1, got 0"),
])
def test_bad_options_are_one_line_usage_errors(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR: {says}") and "Traceback" not in err


def test_a_machine_without_nvidia_smi_has_no_gpus_and_says_why(local_host, capsys):
    assert main(["gpus", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpus"] == [] and doc["seen_from"] == "machine"
    assert any("nvidia-smi not found" in n for n in doc["notes"])
    assert main(["gpus"]) == 0
    assert "no GPUs visible" in capsys.readouterr().out


def test_watch_json_is_one_document_per_reading(scene, capsys):
    assert main(["gpus", "--watch", "--json", "--count", "2", "--interval", "0.3"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(docs) == 2 and all(d["schema"] == 1 and len(d["gpus"]) == 4 for d in docs)
    assert docs[1]["time"] > docs[0]["time"]
