"""The signature table: DESIGN's ids, examples that match, healthy look-alikes that don't, docs in sync."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl.analysis import failuredocs, signatures
from dflashctl.analysis.health import active_hits
from dflashctl.analysis.logscan import scan

ROOT = Path(__file__).resolve().parents[2]
DESIGN_IDS = [
    "compile-thread-race", "cuda-oom", "host-oom", "nccl-timeout", "nccl-error", "cuda-illegal-access",
    "gpu-hardware", "recompile-limit", "nan-loss", "disk-full", "import-error", "cuda-graph-capture",
    "triton-compile", "dataloader-worker", "distributed-init", "segfault",
]


def test_every_design_id_exists_with_summary_and_remedy() -> None:
    """DESIGN's ids first, in order, never renamed; new ids may follow (the contract allows adding)."""
    ids = [r.signature.id for r in signatures.RULES]
    assert ids[: len(DESIGN_IDS)] == DESIGN_IDS and len(set(ids)) == len(ids)
    for r in signatures.RULES:
        assert r.signature.summary.endswith(".") and len(r.signature.remedy) > 40
        assert r.lines or r.exc_types or r.progress_zero


def test_compile_thread_race_remedy_says_how_to_turn_on_the_safe_strategy() -> None:
    remedy = signatures.BY_ID["compile-thread-race"].signature.remedy
    assert 'compile_strategy = "warmup"' in remedy and "one thread" in remedy


# zero-loss is recognised from a run of progress lines, not from one line: test_zero_loss_needs_a_run_of_zeros…
@pytest.mark.parametrize("rule", [r for r in signatures.RULES if not r.progress_zero], ids=lambda r: r.signature.id)
def test_each_example_line_is_recognised_as_its_own_id(rule: signatures.Rule) -> None:
    """Through the whole scanner (anchors, fast path), amid ordinary lines."""
    assert rule.examples
    for ex in rule.examples:
        log = b"step=1 loss=2.0\ninfo: ordinary line\n" + ex.encode() + b"\ninfo: another ordinary line\n"
        hits = [h for h in scan(log).hits if h.signature.id == rule.signature.id]
        assert hits and hits[0].line == 3, ex


@pytest.mark.parametrize("rule", signatures.RULES, ids=lambda r: r.signature.id)
def test_every_line_pattern_contains_an_anchor(rule: signatures.Rule) -> None:
    """The scanner only looks at lines with an anchor: a pattern without one would never fire."""
    for pat in rule.lines:
        assert any(a in pat for a in signatures.ANCHORS), pat


def test_every_line_pattern_compiles() -> None:
    """The scanner compiles a pattern the first time a line reaches it: a broken one must fail here, not there."""
    for rule in signatures.RULES:
        for pat in rule.lines:
            re.compile(pat)


HEALTHY = b"""\
loading target model: 36 layers, hidden states from layers 1,9,17,25,33
eval: error_rate=0.0123 retries=0 mismatches=0
NaN check passed (0 non-finite values in 4096 tensors)
step=100 loss=3.2100 tok/s=1834.2 lr=3.00e-04 acc=0.312 acc_len=2.41
checking for OOM conditions: none; out of memory guard armed
validating loss function config: loss=ce, decay gamma=7
warning: fetch shard 17 failed (ConnectionResetError), retrying in 2 s
ERROR:root:data fetch failed, retrying
Traceback (most recent call last):
  File "/workspace/dflash/code/trainer/data.py", line 88, in fetch
    return urlopen(url, timeout=5).read()
ConnectionResetError: [Errno 104] Connection reset by peer
fetch shard 17: recovered on retry 1
step=200 loss=3.1000 tok/s=1830.0 lr=3.00e-04 acc=0.320 acc_len=2.45
segfault handler installed; ECC errors: 0; nccl timeout set to 600 s
disk: 412 GiB free, no space issues
step=300 loss=3.0500 tok/s=1829.1 lr=3.00e-04 acc=0.331 acc_len=2.47
"""


def test_healthy_log_full_of_look_alike_words_yields_no_signature() -> None:
    r = scan(HEALTHY)
    assert active_hits(r) == []
    assert [p.values["step"] for p in r.progress] == [100, 200, 300]


def test_retried_and_recovered_exception_is_history_but_a_final_one_is_not() -> None:
    recovered = (b"step=1 loss=2.0\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                 b"OSError: [Errno 28] No space left on device\nstep=2 loss=1.9\n")
    assert [h.signature.id for h in scan(recovered).hits] == ["disk-full"]  # seen ...
    assert active_hits(scan(recovered)) == []  # ... but training went on
    final = recovered.rsplit(b"step=2", 1)[0]
    assert [h.signature.id for h in active_hits(scan(final))] == ["disk-full"]


def test_nan_loss_is_active_while_the_last_loss_is_nan() -> None:
    assert [h.signature.id for h in active_hits(scan(b"step=1 loss=2.0\nstep=2 loss=nan\n"))] == ["nan-loss"]
    assert active_hits(scan(b"step=1 loss=nan\nstep=2 loss=1.5\n")) == []


def test_docs_failures_md_is_generated_from_the_table() -> None:
    committed = (ROOT / "docs" / "failures.md").read_text()
    assert committed == failuredocs.markdown(), (
        "docs/failures.md is stale: run `python -m dflashctl.analysis.failuredocs --markdown > docs/failures.md`")


def test_markdown_generator_command() -> None:
    out = subprocess.run([sys.executable, "-m", "dflashctl.analysis.failuredocs", "--markdown"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout == failuredocs.markdown()
    for sid in DESIGN_IDS:
        assert f"## {sid}" in out.stdout


def test_zero_loss_needs_a_run_of_zeros_and_recovers_with_a_real_loss() -> None:
    zeros = b"".join(b"{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 2e-05, 'epoch': 0.%d}\n" % i for i in range(3))
    assert [h.signature.id for h in active_hits(scan(b"{'loss': 1.2, 'epoch': 0.0}\n" + zeros))] == ["zero-loss"]
    assert active_hits(scan(zeros[: zeros.rfind(b"{")])) == []  # two zeros are not yet a run
    assert active_hits(scan(zeros + b"{'loss': 0.93, 'epoch': 0.4}\n")) == []  # learning again: recovered
    assert active_hits(scan(b"step=9000 loss=0.0000 lr=1e-05\n")) == []  # one 0.0 at the end of a converged run
