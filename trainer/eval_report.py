"""The evaluation's records and its table: per request, per prompt set, the whole run. Plain data, no torch.

τ is the reference's figure (dflash 0.1.0, benchmark.py `_print_decode_summary`): the mean over requests of each
request's mean acceptance length, a request being one prompt, or one turn of a multi-turn conversation; requests
without a verification step are left out. The token-weighted figure over all steps is kept as `pooled_tau`.
Timing is the reference's too: per request the decode time per output token, averaged over requests; speedup =
target-only (KV-cached) time per token / speculative time per token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestResult:
    index: int
    """The prompt's index in its set."""
    turn: int
    """The conversation turn (0 for single-turn prompts)."""
    prompt_tokens: int
    new_tokens: int
    steps: int
    """Verification steps (target forwards after the prefill)."""
    tau: float | None
    """Mean acceptance length of this request; None without a step."""
    target_forwards: int
    lossless: bool | None
    """Speculative output == target-only greedy output (temperature 0); None when not checked."""
    acceptance_lengths: list[int] = field(default_factory=list)
    baseline_tpot_s: float | None = None
    """Target-only decoding with its KV cache: decode time per output token; None when not run."""
    spec_tpot_s: float | None = None
    first_mismatch: int | None = None
    mismatch_gap: float | None = None
    """Greedy top-1 minus top-2 logit where they first differ: near 0 = a numerical near-tie (bf16)."""
    near_tie: bool = False
    """A mismatch at a near-tie: the gap is below the target dtype's tolerance (`near_tie_tolerance`), where the
    16-token verify pass and the 1-token baseline run different kernels and may round the two logits either way.
    Counted as a tie, not a failure."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


class _Figures:
    """The figures shared by one prompt set and the whole run, over `self.requests`."""

    requests: list[RequestResult]
    block_size: int

    @property
    def tau(self) -> float | None:
        """The paper's τ: the mean over requests of each request's mean acceptance length."""
        return _mean([r.tau for r in self.requests if r.tau is not None])

    @property
    def pooled_tau(self) -> float | None:
        """Token-weighted: committed tokens / verification steps over every step of every request."""
        steps = sum(r.steps for r in self.requests)
        return sum(sum(r.acceptance_lengths) for r in self.requests) / steps if steps else None

    @property
    def tokens_per_forward(self) -> float | None:
        fwd = sum(r.target_forwards for r in self.requests)
        return sum(r.new_tokens for r in self.requests) / fwd if fwd else None

    @property
    def baseline_tpot_s(self) -> float | None:
        return _mean([r.baseline_tpot_s for r in self.requests if r.baseline_tpot_s is not None])

    @property
    def spec_tpot_s(self) -> float | None:
        return _mean([r.spec_tpot_s for r in self.requests if r.spec_tpot_s is not None])

    @property
    def speedup(self) -> float | None:
        return _ratio(self.baseline_tpot_s, self.spec_tpot_s)

    @property
    def lossless_count(self) -> int:
        return sum(bool(r.lossless) for r in self.requests)

    @property
    def checked(self) -> int:
        return sum(r.lossless is not None for r in self.requests)

    @property
    def lossless(self) -> bool:
        """No real mismatch: every checked request equal to greedy decoding or differing first at a near-tie."""
        return all(r.lossless is not False or r.near_tie for r in self.requests)

    @property
    def near_ties(self) -> int:
        return sum(r.near_tie for r in self.requests)

    def histogram(self) -> list[float]:
        """Share of verification steps with acceptance length 0..block_size (the reference's histogram)."""
        lengths = [n for r in self.requests for n in r.acceptance_lengths]
        return [lengths.count(b) / len(lengths) for b in range(self.block_size + 1)] if lengths else []

    def figures(self) -> dict[str, Any]:
        return {"tau": self.tau, "pooled_tau": self.pooled_tau, "tokens_per_forward": self.tokens_per_forward,
                "baseline_tpot_s": self.baseline_tpot_s, "spec_tpot_s": self.spec_tpot_s,
                "baseline_tok_s": _ratio(1.0, self.baseline_tpot_s), "spec_tok_s": _ratio(1.0, self.spec_tpot_s),
                "speedup": self.speedup, "lossless": self.lossless, "lossless_count": self.lossless_count,
                "near_ties": self.near_ties,
                "checked": self.checked, "num_prompts": len(self.requests), "histogram": self.histogram()}


@dataclass
class SetReport(_Figures):
    name: str
    block_size: int
    requests: list[RequestResult] = field(default_factory=list)


@dataclass
class EvalReport(_Figures):
    block_size: int
    draft: str = "dflash"
    """dflash | ngram | none."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """temperature, top_p, top_k, seed."""
    max_new_tokens: int = 0
    sets: list[SetReport] = field(default_factory=list)

    @property
    def requests(self) -> list[RequestResult]:  # type: ignore[override]
        return [r for s in self.sets for r in s.requests]

    @property
    def prompts(self) -> list[RequestResult]:
        """Every request of every set (the name from before prompt sets)."""
        return self.requests

    def to_dict(self) -> dict[str, Any]:
        return {**self.figures(), "block_size": self.block_size, "draft": self.draft, **self.sampling,
                "max_new_tokens": self.max_new_tokens,
                "sets": [{"name": s.name, **s.figures()} for s in self.sets],
                "prompts": [{"set": s.name, **dataclasses.asdict(r)} for s in self.sets for r in s.requests]}

    def summary(self) -> str:
        """The periodic evaluation's `eval step=N ...` line (keys read by dflashctl's log parser)."""
        return (f"acc_len={_num(self.tau, 3)} tokens_per_forward={_num(self.tokens_per_forward, 3)} "
                f"block_size={self.block_size} lossless={self.lossless_count}/{self.checked} "
                f"near_ties={self.near_ties}")


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def render(report: EvalReport) -> str:
    rows: list[str] = []
    for s in report.sets:
        rows.append(f"== {s.name}: {len(s.requests)} requests")
        rows.append(f"{'prompt':>6} {'turn':>4} {'tokens':>6} {'new':>5} {'steps':>5} {'tau':>6} {'fwd':>5} "
                    f"{'base ms/tok':>11} {'spec ms/tok':>11}  lossless")
        for r in s.requests:
            ok = "yes" if r.lossless else "-" if r.lossless is None else (
                f"{'near-tie' if r.near_tie else 'NO'} (first diff at token {r.first_mismatch}, greedy top-2 gap "
                f"{_num(r.mismatch_gap, 3)})")
            rows.append(f"{r.index:>6} {r.turn:>4} {r.prompt_tokens:>6} {r.new_tokens:>5} {r.steps:>5} "
                        f"{_num(r.tau, 2):>6} {r.target_forwards:>5} {_ms(r.baseline_tpot_s):>11} "
                        f"{_ms(r.spec_tpot_s):>11}  {ok}")
        rows.append(_figures_line(s.name, s))
    t = report.sampling.get("temperature", 0.0)
    ties = f" (+{report.near_ties} differing first at a near-tie)" if report.near_ties else ""
    checked = (f"lossless on {report.lossless_count}/{report.checked} prompts{ties}" if report.checked else
               "lossless not checked" + (" (temperature > 0)" if t else ""))
    rows.append(f"mean acceptance length tau = {_num(report.tau, 3)} (block {report.block_size}, draft "
                f"{report.draft}, temperature {t}); pooled {_num(report.pooled_tau, 3)}; tokens per target forward "
                f"= {_num(report.tokens_per_forward, 3)}; {checked}")
    return "\n".join(rows)


def _figures_line(name: str, f: _Figures) -> str:
    speed = (f"baseline {_num(_ratio(1.0, f.baseline_tpot_s), 1)} tok/s, speculative "
             f"{_num(_ratio(1.0, f.spec_tpot_s), 1)} tok/s, speedup {_num(f.speedup, 2)}x")
    hist = " ".join(f"{x * 100:.0f}%" for x in f.histogram())
    return (f"{name}: tau {_num(f.tau, 3)} (pooled {_num(f.pooled_tau, 3)}), tokens/forward "
            f"{_num(f.tokens_per_forward, 3)}; {speed}; lossless {f.lossless_count}/{f.checked}; "
            f"acceptance histogram 0..{f.block_size}: {hist}")
