"""The compile cache of runs dflashctl launches (issue 24 part 4, the container side): where it lives, and what
`stop` / `kill-zombies` remove after a kill (exactly what torch 2.13's inductor and triton can leave half-written:
agent/lib/compilecache.py), never anything outside the cache directory."""

from __future__ import annotations

import os
import shutil
import sysconfig
import time
from pathlib import Path

import pytest

from dflashctl.agent.lib.compilecache import elf_whole, half_written, remove_half_written, run_cache_env

from .treeprog import settle, tree_of, write_tree_prog
from .userprog import local_box, pve_box

pytestmark = pytest.mark.timeout(240)


def a_real_elf() -> Path:
    lib = Path(sysconfig.get_config_var("DESTSHARED"))
    return next(p for p in sorted(lib.glob("*.so")) if p.stat().st_size > 4096)


def test_only_what_a_killed_process_can_have_left_half_written_is_found(tmp_path):
    cache = tmp_path / "inductor"
    (cache / "ab").mkdir(parents=True)
    (cache / "triton" / "0" / "tmp.pid_1234_9f8e7d").mkdir(parents=True)
    (cache / "triton" / "0" / "tmp.pid_1234_9f8e7d" / "kernel.cubin").write_bytes(b"x")
    (cache / "triton" / "0" / "tmp.pid_77_000").mkdir()  # another process's: kept
    elf = a_real_elf()
    shutil.copy(elf, cache / "ab" / "whole.so")
    data = elf.read_bytes()
    (cache / "ab" / "cut.so").write_bytes(data[: len(data) // 2])  # the linker killed halfway
    (cache / "ab" / "empty.so").write_bytes(b"")  # killed before the first byte
    (cache / "ab" / "empty.o").write_bytes(b"")
    (cache / "ab" / "old-empty.so").write_bytes(b"")
    old = time.time() - 3600
    os.utime(cache / "ab" / "old-empty.so", (old, old))  # older than every killed process: not theirs
    (cache / "ab" / ".1234.140031.tmp").write_bytes(b"partial")  # inductor's write_atomic, pid 1234's
    (cache / "ab" / ".4321.140031.tmp").write_bytes(b"partial")  # a live process's: kept
    (cache / "ab" / "kernel.py").write_bytes(b"")  # source, rewritten on the next compile: not ours to judge
    outside = tmp_path / "outside.so"
    outside.write_bytes(b"")
    (cache / "ab" / "link.so").symlink_to(outside)
    (cache / "elsewhere").symlink_to(tmp_path, target_is_directory=True)

    killed = {1234: time.time() - 60}
    found = sorted(str(Path(p).relative_to(cache)) for p in half_written(str(cache), killed))
    assert found == ["ab/.1234.140031.tmp", "ab/cut.so", "ab/empty.o", "ab/empty.so", "triton/0/tmp.pid_1234_9f8e7d"]
    assert elf_whole(str(elf)) and not elf_whole(str(cache / "ab" / "cut.so"))

    removed, failed = remove_half_written([str(cache)], killed)
    assert sorted(removed) == sorted(str(cache / f) for f in found) and failed == []
    assert (cache / "ab" / "whole.so").exists() and (cache / "ab" / "old-empty.so").exists()
    assert outside.exists() and (cache / "ab" / "link.so").is_symlink() and (tmp_path / "outside.so").exists()
    assert half_written(str(cache), {}) == [] and half_written(str(tmp_path / "absent"), killed) == []


def test_a_users_own_cache_variables_are_respected():
    assert run_cache_env("/ws", {}) == {"TORCHINDUCTOR_CACHE_DIR": "/ws/cache/inductor",
                                        "TRITON_CACHE_DIR": "/ws/cache/triton"}
    assert run_cache_env("/ws", {"TORCHINDUCTOR_CACHE_DIR": "/mine"}) == {"TRITON_CACHE_DIR": "/ws/cache/triton"}


@pytest.fixture(params=["local", pytest.param("pve", marks=[pytest.mark.sshd, pytest.mark.slow])])
def box(request, tmp_path):
    if request.param == "local":
        return local_box(request.getfixturevalue("local_host"), tmp_path)
    return pve_box(request.getfixturevalue("pve"))


def test_stop_removes_what_the_killed_run_left_half_written_in_its_cache(box, cli, tmp_path):
    src = write_tree_prog(tmp_path / "proj")
    launched = cli("launch", "--source", str(src), "--json", "--exec", "--", "python3", "treeprog.py", "--half-write")
    assert launched.code == 0, launched.err
    doc = launched.json()
    tree = tree_of(box.run_dir(doc["run_id"]))
    cache = f"{box.ct_workspace}/cache/inductor"
    assert tree["env"]["TORCHINDUCTOR_CACHE_DIR"] == cache
    assert tree["env"]["TRITON_CACHE_DIR"] == f"{box.ct_workspace}/cache/triton"
    local = box.ct(cache)
    temp = next(local.glob(f".{tree['pid']}.*.tmp"))
    stop = cli("stop", "--grace", "5", "--json")
    assert stop.code == 103, stop.err
    removed = sorted(stop.json()["cache_removed"])
    assert removed == sorted([f"{cache}/{temp.name}", f"{cache}/cabc123.main.so"]), removed
    assert not temp.exists() and not (local / "cabc123.main.so").exists()
    assert (local / "cdone456.main.so").stat().st_size > 0  # a whole artefact stays
    settle(box, [tree["pid"]])


def test_a_cache_dir_given_with_env_is_the_one_used_and_cleaned(box, cli, tmp_path):
    src = write_tree_prog(tmp_path / "proj")
    mine = f"{box.ct_workspace}/my-cache"
    launched = cli("launch", "--source", str(src), "--json", "--env", f"TORCHINDUCTOR_CACHE_DIR={mine}", "--exec",
                   "--", "python3", "treeprog.py", "--half-write")
    assert launched.code == 0, launched.err
    tree = tree_of(box.run_dir(launched.json()["run_id"]))
    assert tree["env"]["TORCHINDUCTOR_CACHE_DIR"] == mine
    assert not box.ct(f"{box.ct_workspace}/cache/inductor").exists()
    stop = cli("stop", "--grace", "5", "--json")
    assert stop.code == 103 and f"{mine}/cabc123.main.so" in stop.json()["cache_removed"], stop.out + stop.err
    assert (box.ct(mine) / "cdone456.main.so").exists()


def test_kill_zombies_removes_what_an_earlier_runs_leftover_left_half_written(box, cli, tmp_path):
    """A leftover of an earlier run (its marker) that wrote into its cache: ended by kill-zombies, which removes
    its half-written artefacts and keeps the whole ones."""
    write_tree_prog(box.ct(f"{box.ct_workspace}/old"))
    run_id = "20200101-000000-old"
    run_dir = f"{box.ct_workspace}/runs/{run_id}"
    box.ct(run_dir).mkdir(parents=True)
    (box.ct(run_dir) / "exit_code").write_text("0\n")
    cache = f"{box.ct_workspace}/cache/inductor"
    started = box.sh('cd "$1/old" && DFLASH_RUN_ID="$2" DFLASH_RUN_DIR="$3" TORCHINDUCTOR_CACHE_DIR="$4" '
                     '"$5" treeprog.py --half-write </dev/null >/dev/null 2>&1 & echo $!',
                     [box.ct_workspace, run_id, run_dir, cache, box.python])
    assert started.returncode == 0, started.stderr
    tree = tree_of(box.ct(run_dir))
    res = cli("kill-zombies", "--yes", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert [z["pid"] for z in doc["zombies"]] == [tree["pid"]] and doc["ended"] == 1
    local = box.ct(cache)
    removed = sorted(doc["cache_removed"])
    assert len(removed) == 2 and removed[0].startswith(f"{cache}/.{tree['pid']}.") and removed[0].endswith(".tmp")
    assert removed[1] == f"{cache}/cabc123.main.so", removed
    assert not list(local.glob(f".{tree['pid']}.*.tmp")) and not (local / "cabc123.main.so").exists()
    assert (local / "cdone456.main.so").exists()
    settle(box, [tree["pid"]])
