"""benchmarks/gpu_check.sh --cpu-dry-run runs every step of the GPU check on tiny shapes: the environment probe,
the recipe-shaped runs with graphs off and on, two drafter threads, the process layout with 2 ranks, a bf16 HF
target eval at T=0 with its near-tie count, and the issue-13 pieces; every figure lands in $OUT as it is made."""

from __future__ import annotations

import os
import subprocess
import tarfile

from trainer_harness import REPO


def test_cpu_dry_run_exercises_every_step_and_writes_out_as_it_goes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "TMPDIR": str(tmp_path), "GPU_CHECK_NO_SAVE": "1",
           "RUN_TIMEOUT_S": "400", "TOTAL_BUDGET_S": "1500"}  # this CPU is shared; the GPU budget is 330 s
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DFLASH_FAULT"):
        env.pop(key, None)
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu-dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "gpu_check.md").read_text()
    assert table.startswith("# CPU DRY RUN of benchmarks/gpu_check.sh")
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in table.splitlines() if ln.startswith("| ")}
    for name in ("recipe, graphs off", "recipe, graphs on (warm cache)", "2 drafter threads, one GPU",
                 "process layout, 2 ranks, one GPU", "bf16 HF target eval, T=0", "pieces (gpu_check_dflash.py)"):
        assert rows[name].split(" | ")[1] == "0", rows[name]
    for name in ("recipe, graphs off", "2 drafter threads, one GPU", "process layout, 2 ranks, one GPU"):
        step_ms, tok_s = rows[name].split(" | ")[3:5]
        assert float(step_ms) > 0 and float(tok_s) > 0, rows[name]
    assert "near-ties 0, verdict pass" in rows["bf16 HF target eval, T=0"]
    env_txt = (out / "env.txt").read_text()
    assert "torch 2." in env_txt and "cuda_graphs_probe device=cpu verdict=not-applicable" in env_txt
    with tarfile.open(out / "gpu_check_logs.tar.gz") as tar:
        assert any(n.endswith("4-ranks.log") for n in tar.getnames())
