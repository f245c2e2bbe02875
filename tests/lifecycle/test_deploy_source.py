"""`deploy` of any directory (the user's own training code): which files ship, size limits, the host's
`code_source`, bad input, and the same through a real sshd + `pct exec` (tests/harness)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.envs import toml_str

from dflashctl.agent import codetree
from dflashctl.commands import deploy as deploy_cmd

from .conftest import FAKE_TRAINER, write_config

pytestmark = pytest.mark.timeout(120)

TRAIN_PY = 'import json, pathlib\nprint("training with", json.loads(pathlib.Path("conf/run.json").read_text()))\n'

# every file of the user tree below, and whether it ships
TREE = {
    "train.py": True,
    "conf/run.json": True,
    "model/__init__.py": True,
    "model/layers.py": True,
    "model/layers.py~": False,  # editor leftover (default)
    "run.sh": True,
    "notes.log": False,  # root .gitignore: *.log
    "keep.log": True,  # ... but !keep.log
    "data/raw/huge.bin": False,  # .dflashignore: data/raw/
    "data/small.jsonl": True,
    "data/gen/out.jsonl": False,  # nested data/.gitignore: gen/
    "data/gen.txt": True,  # gen/ matches directories only
    "outputs/run1/metrics.json": False,  # /outputs/ anchored at the root
    "model/outputs/keep.py": True,  # ... so not this one
    "scratch/a.txt": False,  # .gitignore: scratch/*
    "scratch/README.md": True,  # ... !scratch/README.md (the directory itself is not excluded)
    "secret.env": False,  # .dflashignore only (git would keep it)
    "checkpoints/step-100.pt": False,  # default: checkpoints/
    "wandb/run-1/files/output.log": False,  # default: wandb/
    ".venv/bin/python": False,  # always: virtualenvs
    ".venv/pyvenv.cfg": False,
    "myenv/pyvenv.cfg": False,  # any directory with pyvenv.cfg is a virtualenv
    "myenv/lib/python3.12/site-packages/torch/__init__.py": False,
    "model/__pycache__/layers.cpython-312.pyc": False,  # always: caches, bytecode
    "model/stale.pyc": False,
    ".git/HEAD": False,  # always: version control
    ".git/objects/ab/cdef": False,
    "node_modules/left-pad/index.js": False,  # default
}
IGNORES = {
    ".gitignore": "# build output\n*.log\n!keep.log\n/outputs/\nscratch/*\n!scratch/README.md\n",
    "data/.gitignore": "gen/\n",
    ".dflashignore": "data/raw/\nsecret.env\n",
}
SHIPPED = sorted([*IGNORES, *(rel for rel, ships in TREE.items() if ships)])


def user_tree(root: Path) -> Path:
    for rel, body in {**{rel: f"# {rel}\n" for rel in TREE}, **IGNORES, "train.py": TRAIN_PY,
                      "conf/run.json": '{"lr": 0.001}'}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    (root / "run.sh").chmod(0o755)
    return root


def landed(code: Path) -> list[str]:
    """Every regular file really under <workspace>/code, but our own hash file."""
    return sorted(str(p.relative_to(code)) for p in code.rglob("*")
                  if p.is_file() and p.name != codetree.HASH_FILE)


def one_line_error(res, starts: str) -> str:
    lines = res.err.strip().splitlines()
    assert res.code == 2 and "Traceback" not in res.err, res.err
    assert lines[0].startswith(f"ERROR: {starts}"), res.err
    assert len(lines) <= 2 and all(ln.startswith(("ERROR:", "HINT:")) for ln in lines), res.err
    return lines[0]


def test_a_user_tree_ships_exactly_its_files_directly_under_code(local_host, cli, tmp_path):
    src = user_tree(tmp_path / "my-dflash")
    assert cli("deploy", "--check", "--source", str(src)).code == 1  # nothing deployed yet

    res = cli("deploy", "--source", str(src), "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["changed"] is True and doc["files"] == len(SHIPPED) and doc["source"] == str(src.resolve())
    code = local_host.workspace_dir / "code"
    assert code.is_symlink() and os.readlink(code) == f".code/{doc['hash'][:16]}"
    assert landed(code) == SHIPPED
    assert (code / ".dflash-code-hash").read_text().strip() == doc["hash"]
    assert os.access(code / "run.sh", os.X_OK) and not os.access(code / "train.py", os.X_OK)
    assert doc["hash"] == codetree.tree_hash(str(code)) == codetree.tree_hash(str(src))
    # the program runs where launch runs it: in <workspace>/code, its files right there
    ran = subprocess.run([sys.executable, "train.py"], cwd=code, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout == "training with {'lr': 0.001}\n", ran.stderr

    # unchanged: nothing is sent; a change to an ignored file changes nothing either
    (src / "notes.log").write_text("more log")
    (src / "checkpoints" / "step-200.pt").write_bytes(b"\0" * 4096)
    (src / "model" / "__pycache__" / "new.cpython-312.pyc").write_bytes(b"\0")
    again = cli("deploy", "--source", str(src), "--json").json()
    assert again == {**again, "changed": False, "bytes_sent": 0, "hash": doc["hash"]}
    assert cli("deploy", "--check", "--source", str(src)).code == 0

    # an edit that ships: stale, then deployed as a new version; the old one stays (a run may work in it)
    (src / "model" / "layers.py").write_text("# changed\n")
    stale = cli("deploy", "--check", "--source", str(src))
    assert stale.code == 1 and "stale" in stale.out
    new = cli("deploy", "--source", str(src), "--json").json()
    assert new["changed"] is True and new["hash"] != doc["hash"]
    assert (code / "model" / "layers.py").read_text() == "# changed\n"
    assert (local_host.workspace_dir / ".code" / doc["hash"][:16] / "model" / "layers.py").read_text() \
        == "# model/layers.py\n"

    # a file newly ignored leaves the tree
    (src / ".dflashignore").write_text(IGNORES[".dflashignore"] + "conf/\n")
    assert cli("deploy", "--check", "--source", str(src)).code == 1
    cli("deploy", "--source", str(src))
    assert not (code / "conf").exists() and (code / "train.py").exists()


def test_a_file_over_the_size_limit_is_refused_by_name_before_anything_is_sent(local_host, cli, tmp_path):
    src = user_tree(tmp_path / "proj")
    big = src / "model" / "weights.safetensors"
    with open(big, "wb") as f:  # sparse: 51 MiB by size, nothing on disk
        f.truncate(51 * 1024 * 1024)
    res = cli("deploy", "--source", str(src))
    line = one_line_error(res, f"refusing to deploy {src.resolve()}: 1 file over the 50 MiB per-file limit: ")
    assert line.endswith(": model/weights.safetensors (51.0 MiB)")
    assert f"exclude it in {src.resolve() / '.dflashignore'} (a line like `/model/weights.safetensors`)" in res.err
    assert not (local_host.workspace_dir / "code").exists()
    assert cli("deploy", "--check", "--source", str(src)).code == 2  # check refuses it alike
    with open(src / "data" / "train.bin", "wb") as f:
        f.truncate(3 * 1024 ** 3)
    two = one_line_error(cli("deploy", "--source", str(src)), f"refusing to deploy {src.resolve()}: 2 files over")
    assert two.endswith("limit: data/train.bin (3.0 GiB), model/weights.safetensors (51.0 MiB)")
    (src / "data" / "train.bin").unlink()

    assert cli("deploy", "--source", str(src), "--max-file-mib", "60").code == 0  # raised for this deploy
    (src / ".dflashignore").write_text(IGNORES[".dflashignore"] + "*.safetensors\n")
    assert cli("deploy", "--source", str(src), "--json").json()["changed"] is True  # excluded: ships again
    assert not (local_host.workspace_dir / "code" / "model" / "weights.safetensors").exists()


def test_the_total_limit_names_the_biggest_files_and_comes_from_hosts_toml(local_host, cli, tmp_path):
    src = user_tree(tmp_path / "proj")
    for i, kib in enumerate((700, 500, 300, 200)):
        (src / "data" / f"part-{i}.bin").write_bytes(os.urandom(kib * 1024))
    with open(local_host.hosts_file, "a") as f:
        f.write("code_max_total_mib = 1.5\n")
    res = cli("deploy", "--source", str(src))
    line = one_line_error(res, f"refusing to deploy {src.resolve()}: 1.7 MiB in {len(SHIPPED) + 4} files is over the "
                               "1.5 MiB total limit; biggest: ")
    assert line.endswith("biggest: data/part-0.bin (0.7 MiB), data/part-1.bin (0.5 MiB), data/part-2.bin (0.3 MiB)")
    assert "`/data/`" in res.err and "code_max_total_mib" in res.err
    assert cli("deploy", "--source", str(src), "--max-total-mib", "2").code == 0


def test_a_source_that_is_not_a_directory_is_one_line_exit_2(local_host, cli, tmp_path):
    afile = tmp_path / "train.py"
    afile.write_text(TRAIN_PY)
    for bad, problem in ((afile, "not a directory"), (tmp_path / "nope", "no such directory")):
        for argv in (("deploy", "--source", str(bad)), ("deploy", "--check", "--source", str(bad))):
            assert one_line_error(cli(*argv), f"--source {bad}: {problem}") == f"ERROR: --source {bad}: {problem}"
    empty = tmp_path / "empty"
    (empty / "__pycache__").mkdir(parents=True)
    one_line_error(cli("deploy", "--source", str(empty)), f"nothing to deploy in {empty}")
    assert not (local_host.workspace_dir / "code").exists()


def test_the_host_code_source_is_the_default_and_source_wins_over_it(local_host, cli, tmp_path):
    src = user_tree(local_host.hosts_file.parent / "my-dflash")
    other = tmp_path / "other"
    other.mkdir()
    (other / "main.py").write_text("print('other')\n")
    with open(local_host.hosts_file, "a") as f:
        f.write('code_source = "my-dflash"\n')  # relative: next to hosts.toml
    res = cli("deploy", "--json")
    assert res.code == 0 and res.json()["source"] == str(src.resolve()), res.err
    code = local_host.workspace_dir / "code"
    assert landed(code) == SHIPPED
    assert cli("deploy", "--check").code == 0
    assert cli("deploy", "--source", str(other)).code == 0 and landed(code) == ["main.py"]
    assert cli("deploy", "--check").code == 1  # the host default is not what is deployed now

    shutil.rmtree(src)
    line = one_line_error(cli("deploy"), f"{local_host.hosts_file}:")
    assert line.endswith(f"[hosts.local] code_source: {src}: no such directory")


@pytest.mark.parametrize(("body", "key", "problem"), [
    ("code_source = 5", "code_source", "must be a directory path string, not an integer"),
    ('code_source = ""', "code_source", "must be a directory path string, not empty"),
    ("code_max_file_mib = -1", "code_max_file_mib", "must be a number from 0.001 to 1048576 MiB, not -1 (e.g. 50)"),
    ('code_max_total_mib = "200"', "code_max_total_mib",
     "must be a number from 0.001 to 1048576 MiB, not '200' (e.g. 50)"),
    ("code_max_total_mib = true", "code_max_total_mib",
     "must be a number from 0.001 to 1048576 MiB, not True (e.g. 50)"),
])
def test_bad_code_keys_in_hosts_toml_name_file_line_and_key(local_host, cli, body, key, problem):
    with open(local_host.hosts_file, "a") as f:
        f.write(body + "\n")
    line = one_line_error(cli("deploy"), f"{local_host.hosts_file}:7: [hosts.local] {key}: ")
    assert line.endswith(problem)


def test_without_source_our_trainer_still_lands_as_code_trainer(local_host, cli):
    res = cli("deploy", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    ours = deploy_cmd.bundled_trainer()
    assert doc["source"] == str(ours) and doc["changed"] is True
    code = local_host.workspace_dir / "code"
    assert landed(code) == [f"trainer/{rel}" for rel in codetree.iter_files(str(ours))]
    assert (code / "trainer" / "__main__.py").is_file()
    ran = subprocess.run([sys.executable, "-c", "import trainer.config"], cwd=code, capture_output=True, timeout=60)
    assert ran.returncode == 0, ran.stderr  # `python -m trainer` finds it in <workspace>/code
    out = cli("deploy")
    assert out.code == 0 and "is current" in out.out and "nothing sent" in out.out


def test_launch_deploys_a_user_tree_and_meta_records_its_hash(local_host, cli, tmp_path):
    src = user_tree(tmp_path / "proj")
    shutil.copytree(FAKE_TRAINER, src / "trainer")  # a tree of its own that carries a `trainer` package
    cfg = write_config(tmp_path / "short.toml", mode="train", steps=2, step_s=0.05)
    res = cli("launch", "--source", str(src), "--config", str(cfg), "--wait-for", "exit", "--json")
    assert res.code == 0, res.err
    meta = json.loads((Path(res.json()["run_dir"]) / "meta.json").read_text())
    code = local_host.workspace_dir / "code"
    assert meta["code_hash"] == codetree.tree_hash(str(src)) == (code / ".dflash-code-hash").read_text().strip()
    assert (code / "train.py").is_file() and (code / "trainer" / "__main__.py").is_file()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_user_tree_through_ssh_and_pct(pve, cli, tmp_path):
    src = user_tree(tmp_path / "my-dflash")
    text = pve.hosts_file.read_text()  # the host default this time, not --source
    pve.hosts_file.write_text(text.replace("[hosts.pve]\n", f"[hosts.pve]\ncode_source = {toml_str(str(src))}\n", 1))
    assert cli("deploy", "--check").code == 1
    first = cli("deploy", "--json")
    assert first.code == 0, first.err
    doc = first.json()
    assert doc["changed"] is True and doc["path"] == f"/workspace/dflash/.code/{doc['hash'][:16]}"
    code = pve.workspace_dir / "dflash" / "code"
    assert landed(code) == SHIPPED
    ran = pve.exec(["sh", "-c", "cd /workspace/dflash/code && exec python3 train.py"])
    assert ran.returncode == 0 and ran.stdout.decode() == "training with {'lr': 0.001}\n", ran.stderr

    again = cli("deploy", "--json").json()
    assert again["changed"] is False and again["bytes_sent"] == 0
    # the container hashes the files really there, with the same rules: a run's __pycache__ changes nothing,
    # a hand edit there does
    compiled = pve.exec(["sh", "-c", "cd /workspace/dflash/code && python3 -m py_compile model/layers.py"])
    assert compiled.returncode == 0 and (code / "model" / "__pycache__").is_dir(), compiled.stderr
    assert cli("deploy", "--check").code == 0
    pve.exec(["sh", "-c", "echo '# edited in the container' >> /workspace/dflash/code/train.py"])
    edited = cli("deploy", "--check")
    assert edited.code == 1 and "edited in place" in edited.out
    fixed = cli("deploy", "--json").json()
    assert fixed["changed"] is True and fixed["hash"] == doc["hash"]
    assert cli("deploy", "--check").code == 0 and (code / "train.py").read_text() == TRAIN_PY

    (src / "train.py").write_text(TRAIN_PY + "# v2\n")
    assert cli("deploy", "--check").code == 1
    assert cli("deploy", "--json").json()["changed"] is True and (code / "train.py").read_text().endswith("# v2\n")
