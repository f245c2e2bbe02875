"""parse_progress's shortcuts (issue 16: a one-shot status parses a thousand progress lines) give exactly what the
full parse gives: a regex skipped only where a cheap check shows it cannot match, and `k=v k=v …` lines split
instead of searched. The reference below is the parse without any shortcut, run on lines built to hit and to
just miss each shortcut's condition (spaces, slashes, brackets, quotes, colons, nan, odd cases, prefixes)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dflashctl.analysis import progress as P
from dflashctl.analysis.lineprefix import split
from dflashctl.model import ProgressPoint


def reference(text: str, line: int) -> ProgressPoint | None:
    """parse_progress as it was before the shortcuts: every regex on every line."""
    if not any(k in text for k in P.PROGRESS_TOKENS):
        return None
    text = split(text).body
    values: dict[str, float] = {}
    bar = P._bar(text) if "/" in text and "[" in text else None
    if bar is not None:
        values.update(bar)
    m = P._GRAD_NORM_RE.search(text)
    if m:
        values.setdefault("grad_norm", float(m.group(1)))
    m = P._OF_TOTAL_RE.search(text)
    if m and "step" not in values:
        values["step"], values["total"] = float(m.group(1)), float(m.group(2))
    for key, num in P._KV_RE.findall(text):
        k = key.lower()
        k = P._KEY_ALIASES.get(k, k)
        if k not in values:
            values[k] = float(num)
    for key, num in P._SPACED_RE.findall(text):
        k = P._KEY_ALIASES.get(key.lower(), key.lower())
        values.setdefault(k, float(num))
    if "step" in values and not values["step"].is_integer():
        del values["step"]
    for alias in ("steps", "batch"):
        if "step" not in values and alias in values and "loss" in values and values[alias].is_integer():
            values["step"] = values[alias]
    if "loss" not in values and not ("step" in values and len(values) > 1):
        return None
    if "loss" in values and "loss_mean" not in values and P._MEAN_LOSS_RE.search(text):
        values["loss_mean"] = values["loss"]
    return ProgressPoint(line=line, values=values, kind="eval" if P._EVAL_RE.match(text) else "train")


KEYS = ["step", "loss", "Loss", "iter", "STEP", "tok/s", "lr", "grad_norm", "Grad_Norm", "x.grad_norm", "acc_len",
        "total", "steps", "batch", "epoch", "train/loss", "eval", "a1/2b", "step1", "it/s", "_k", "é", "global_step",
        "Mean_loss", "avg_loss", "Average Training loss", "mean"]
NUMS = ["0", "12", "3.5", "-1", "+2", ".5", "5.", "1e-4", "3.00e-04", "1E+3", "nan", "inf", "NaN", "1.2.3", "0x1F",
        "1e", "10/100", "5/8", "2 / 3", "007"]
SEPS = [" ", "  ", "=", ": ", " = ", ":", "\t", " | ", ", ", "/", " / "]


@st.composite
def lines(draw: st.DrawFn) -> str:
    """Mostly well-formed `k=v` lines, with a chance of one piece swapped for something just outside the form."""
    n = draw(st.integers(1, 6))
    parts = []
    for _ in range(n):
        key, num = draw(st.sampled_from(KEYS)), draw(st.sampled_from(NUMS))
        eq = draw(st.sampled_from(["="] * 6 + SEPS))
        parts.append(f"{key}{eq}{num}")
    glue = draw(st.sampled_from([" "] * 6 + SEPS))
    text = glue.join(parts)
    extra = draw(st.sampled_from(["", "", "", " ", "[", "]", " 45%|##| 3/10 [00:01<00:02, 2.5it/s, loss=2.3]",
                                  "'", "{'loss': 2.5}", "[rank0]: ", "eval ", "Epoch(train) [1][25/73] ",
                                  "grad norm: 3.5 ", "iteration  100/ 1000 | ", "step 5/8 ",
                                  "[step 2/3] ", "INFO ", "stdout: ", "rank3: ", "12-03 10:00:00 ", "> ",
                                  "I1203 10:00:00.123 99 x.py:1] ", "(RayTrainWorker pid=12) ", "\x1b[0m"]))
    where = draw(st.sampled_from(["start", "end"]))
    return extra + text if where == "start" else text + extra


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(lines())
def test_the_shortcut_parse_equals_the_full_parse(text: str) -> None:
    assert repr(P.parse_progress(text, 7)) == repr(reference(text, 7))


def test_the_shortcuts_are_taken_for_the_trainers_own_line_and_not_for_a_spaced_one() -> None:
    """The plain-line form is what the trainer prints (telemetry.log_line); `step 5 loss 2.0` is not plain."""
    ours = "step=12 loss=4.1234 tok/s=1834.2 lr=3.00e-04 acc=0.123 acc_len=3.1"
    assert P._PLAIN_KV_LINE_RE.fullmatch(ours)
    assert P.parse_progress(ours, 1) == reference(ours, 1)
    assert P.parse_progress(ours, 1).values["tok/s"] == 1834.2
    spaced = "step 5 loss=2.0"
    assert not P._PLAIN_KV_LINE_RE.fullmatch(spaced)
    assert P.parse_progress(spaced, 1).values == {"loss": 2.0, "step": 5.0}


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(st.from_regex(P._PLAIN_KV_LINE_RE, fullmatch=True))
def test_a_plain_line_has_no_prefix_to_take_off(text: str) -> None:
    """Why parse_progress may skip lineprefix.split for a `k=v k=v …` line: split would leave it as it is."""
    assert split(text).body == text and split(text).rank is None


@settings(max_examples=500, deadline=None)
@given(st.from_regex(P._PLAIN_KV_LINE_RE, fullmatch=True))
@example("a1/2b=3 tok/s=1.5").via("a key holding digit/digit")
@example("tok/s=1834.2 x/1=2 y1/=3").via("slashes beside one digit only")
@example("k\u0663/\u0664=1").via("digits of another script")
@example("k\u00b2/\u00b3=1").via("superscripts: digits to isdigit, not decimals")
def test_a_plain_lines_digit_slash_test_answers_as_the_regex(text: str) -> None:
    assert P._digit_slash_digit(text) == (P._DIGIT_SLASH_RE.search(text) is not None)
