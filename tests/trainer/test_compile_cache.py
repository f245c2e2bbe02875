"""A half-written inductor cache (issue 24 part 4): the trainer recognises the load failure of a truncated
artefact, removes it (only inside the cache directory), compiles again once and says so in its log."""

from __future__ import annotations

import os
from pathlib import Path

from torch._inductor.exc import InductorError
from trainer_harness import FAST

from trainer.compile_cache import (
    CacheFailure,
    diagnose,
    failed_again_line,
    recognise,
    recovered_line,
    remove_corrupt,
)

SO = "/tmp/torchinductor_root/oi/coir2gi6fxha2og6soltka6p4spk5tlkpnedc2g2e5fllmrz63il.main.so"


def _inductor_error(inner: Exception) -> InductorError:
    try:
        raise InductorError(inner, None) from inner
    except InductorError as e:
        return e


def test_a_truncated_shared_object_wrapped_in_inductor_error_is_recognised():
    err = _inductor_error(ImportError(f"{SO}: file too short"))
    assert recognise(err) == CacheFailure(SO, f"ImportError: {SO}: file too short")


def test_an_empty_generated_module_is_recognised_by_its_key(tmp_path):
    key = "cvnbylxd25cdgfzca4k2bqni2xd7l5bh6cxns7fr24h73tbdas64"
    (tmp_path / "vn").mkdir()
    (tmp_path / "vn" / f"{key}.py").write_text("")
    err = RuntimeError(f"backend='inductor' raised:\nAttributeError: module "
                       f"'torch._inductor.runtime.compile_tasks.{key}' has no attribute 'call'")
    found = diagnose(err, tmp_path)
    assert found is not None and found.artefact == str(tmp_path / "vn" / f"{key}.py")
    assert found.error.startswith("AttributeError: module 'torch._inductor.runtime.compile_tasks.")


def test_other_failures_are_not_the_caches(tmp_path):
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "cab.so").write_bytes(b"\x7fELF")
    assert diagnose(ImportError("No module named 'triton'"), tmp_path) is None
    assert recognise(RuntimeError("CUDA out of memory")) is None


def test_an_empty_artefact_the_error_does_not_name_is_still_the_culprit(tmp_path):
    """A 0-byte ISA-probe .so makes inductor build unvectorised kernels that fail to compile elsewhere."""
    (tmp_path / "3g").mkdir()
    probe = tmp_path / "3g" / "c3g2mqobe6g24e353lemr6cpzfcmocdsk5rbq3mousrlfxbh7zgy.so"
    probe.write_bytes(b"")
    found = diagnose(RuntimeError("main.cpp:33:39: error: 'at::vec' has not been declared"), tmp_path)
    assert found is not None and found.artefact == str(probe)


def test_removal_stays_inside_the_cache_directory(tmp_path):
    root, outside = tmp_path / "cache", tmp_path / "elsewhere"
    (root / "oi").mkdir(parents=True)
    outside.mkdir()
    named = root / "oi" / "coir.main.so"
    named.write_bytes(b"")
    (root / "oi" / "coir.main.cpp").write_text("int x;")  # the named artefact's source goes with it
    (root / "oi" / "cgood.so").write_bytes(b"\x7fELF")  # a valid artefact stays
    (root / "xy").mkdir()
    (root / "xy" / "cempty.py").write_text("")  # another half-written one goes
    stray = outside / "cstray.so"
    stray.write_bytes(b"")
    os.symlink(stray, root / "xy" / "clink.so")  # a link out of the cache: neither it nor its target
    removed = remove_corrupt(CacheFailure(str(named), "ImportError: file too short"), root)
    assert sorted(removed) == sorted([named, root / "oi" / "coir.main.cpp", root / "xy" / "cempty.py"])
    assert (root / "oi" / "cgood.so").exists() and stray.exists() and (root / "xy" / "clink.so").is_symlink()
    # a path outside the cache named by an error is never touched
    assert remove_corrupt(CacheFailure(str(stray), "ImportError: file too short"), root) == []
    assert stray.exists()


def test_log_lines():
    f = CacheFailure(SO, f"ImportError: {SO}: file too short")
    assert recovered_line(f, [Path(SO)], Path("/tmp/torchinductor_root")) == (
        f"compile cache: corrupt artefact {SO} (ImportError: {SO}: file too short); removed 1 file(s) from "
        "/tmp/torchinductor_root; compiling again once")
    again = failed_again_line(_inductor_error(ImportError(f"{SO}: file too short")), Path("/c"))
    assert again == f"compile cache: the compile failed again after removing corrupt artefacts from /c: " \
                    f"ImportError: {SO}: file too short"


def test_truncated_cache_after_a_first_run_the_next_run_reaches_its_first_step(start_trainer, tmp_path):
    cache = tmp_path / "inductor-cache"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    args = [*FAST, "--set", "runtime.compile_strategy=warmup", "--set", "train.steps=1",
            "--set", 'devices.drafters=["cpu"]']
    first = start_trainer(*args, run_dir=tmp_path / "first", env=env)
    assert first.wait(900) == 0, first.log[-3000:]
    compiled = [p for p in cache.rglob("*") if p.is_file() and p.suffix in (".so", ".py")]
    assert compiled
    for p in compiled:
        p.write_bytes(b"")  # what a kill mid-write leaves
    second = start_trainer(*args, run_dir=tmp_path / "second", env=env)
    assert second.wait(900) == 0, second.log[-3000:]
    lines = [ln for ln in second.log.splitlines() if ln.startswith("compile cache: corrupt artefact ")]
    assert len(lines) == 1 and f"from {cache}; compiling again once" in lines[0], second.log[-3000:]
    assert sorted(second.steps()) == [1]
    assert "failed again" not in second.log
