"""Progress lines of the common trainers → ProgressPoint (step, total, loss, grad_norm, rate, ETA …).

`step=12 loss=4.1234 tok/s=1834.2 lr=3.00e-04 acc=0.123 acc_len=3.1` is the contract with trainer/
(telemetry.log_line). Understood besides, because most users did not write our trainer:

- key=value / key: value / dict forms: Hugging Face Trainer `{'loss': 2.31, 'grad_norm': nan, 'learning_rate':
  5e-05, 'epoch': 0.1}`, torchtitan `step: 10  loss:  9.7320`, DeepSpeed `steps: 100 loss: 2.31`, accelerate;
- nanoGPT `iter 100: loss 2.3051, time 45.20ms`, Megatron `iteration  100/ 1000 | lm loss: 2.3E+00 | grad norm: …`,
  mmengine `Epoch(train) [1][250/735]  … loss: 2.3`, `Step 120/1000`;
- tqdm bars (HF Trainer's bare bar, PyTorch Lightning's `Epoch 3:  45%|…| 120/266 [00:40<00:49, 2.95it/s,
  train_loss=2.31]`, any `Training:` bar): step, total, rate and ETA. Bars of other work (loading checkpoint
  shards, `Map`, tokenising, validation, evaluation) are not training: only a bar with no description, or one
  whose description says epoch / train / step / iter / batch, counts.

A line is progress only when it carries a loss, or a step with some other measurement: `error_rate=0.01` is not, and
neither is a line that only names a step (`resume: continuing from checkpoint step=285`, printed before the warm-up,
would otherwise count as training).
"""

from __future__ import annotations

import re

from dflashctl.analysis.lineprefix import split
from dflashctl.model import ProgressPoint

# no progress line lacks all of these (the scanner's fast path looks for them with rfind)
PROGRESS_TOKENS = ("step", "loss", "iter", "Step", "Loss", "STEP", "LOSS", "it/s", "s/it", "/s,", "/s]")

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b"
_KV_RE = re.compile(rf"(?<![\w/.])['\"]?([A-Za-z_][\w./-]*?)['\"]?\s*[=:]\s*['\"]?({_NUM})", re.IGNORECASE)
_EVAL_RE = re.compile(r"\s*eval\b", re.IGNORECASE)  # the trainer's `eval step=100 acc_len=6.81 …` (PeriodicEval)
# `loss 2.3`, and the total's own names hand-written loggers print the same way (`loss_total nan`, `train_loss 2.3`)
# (also as a bracketed field name: loguru-style `| [Loss] nan | … | [step]   164 |`)
# (a counter's name after a `/` is a unit: fairseq's `words/batch    906` is a size, not a step)
_SPACED_RE = re.compile(
    rf"((?<![\w/])(?:step|iter|epoch|batch)|\b(?:loss|loss_total|total_loss|train_loss))\]?\s+({_NUM})", re.IGNORECASE)
_GRAD_NORM_RE = re.compile(rf"\bgrad[ _]norm\s*[=:]\s*({_NUM})", re.IGNORECASE)  # Megatron's `grad norm: nan`
# `iteration  100/ 1000`, `Step 120/1000`, `[step 5/50]`, mmengine `Iter(train) [ 580/2046]` and `[1][250/735]`,
# fairseq `epoch 001:    650 / 1891` and `| epoch 010 |  3000 / 8223` (the position in the epoch; never `(val)`)
_OF_TOTAL_RE = re.compile(
    r"(?:\b(?:iteration|step|iter|batch)s?(?:\(train\))?\s*[=:]?\s*\[?\s*|Epoch(?:\(train\))?:?\s*\[\s*\d+\s*\]\s*\[\s*"
    r"|\bepoch\s+\d+\s*[:|]?\s+)(\d+)\s*/\s*(\d+)\b",
    re.IGNORECASE)
_BAR_RE = re.compile(  # n/total [elapsed<eta, rate unit(, postfix)] — the postfix may be cut at the line's end
    r"(?:^|\r|[^\d/])(\d+)/(\d+)\s*\[(\d[\d:]*)<(\?|\d[\d:]*),\s*(\?|[\d.]+)\s*([A-Za-z]+/s|s/[A-Za-z]+)"
    r"(?:,\s*([^\]]*))?(?:\]|$)")
# an epoch's aggregate of the total (`Mean Training loss : nan`, `avg_loss=nan`), not a named part (`mean center loss`)
_MEAN_LOSS_RE = re.compile(r"\b(?:[Mm]ean|[Aa]vg|[Aa]verage)[ _](?:[Tt]rain(?:ing)?[ _])?[Ll]oss\s*[=:]")
_BAR_DESC_OK = re.compile(r"epoch|train|step|iter|batch|loss", re.IGNORECASE)  # trlx: `[losses/total_loss: 1.3 | …]:`
# Cheap necessary conditions, checked before the regexes they guard (a scan parses a thousand lines at a time):
# _OF_TOTAL_RE needs a digit, `/`, a digit; _GRAD_NORM_RE the word grad in any case.
_DIGIT_SLASH_RE = re.compile(r"\d\s*/\s*\d")
# `k=v k=v …` and nothing else (our trainer's contract, and most hand-written loggers): for such a line _KV_RE finds
# exactly its pairs (each key starts after a space or the line's start, each value is one whole number) and
# _SPACED_RE nothing (its keywords would have to end where a number ends), so a plain split gives the same values.
_V = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_K = r"[A-Za-z_][\w./-]*"
_PLAIN_KV_LINE_RE = re.compile(rf"{_K}={_V}(?: {_K}={_V})*")
_PLAIN_PAIR_RE = re.compile(r"([^ =]+)=([^ ]+)")
_KEY_ALIASES = {
    "iter": "step", "iteration": "step", "global_step": "step", "tps": "tok/s", "tokens/s": "tok/s", "tok/sec": "tok/s",
    "tokens_per_sec": "tok/s", "tokens_per_second": "tok/s", "tok_per_s": "tok/s", "wps": "tok/s",
    "learning_rate": "lr", "train_loss": "loss", "lm_loss": "loss", "lm loss": "loss", "train/loss": "loss",
    "reduced_train_loss": "loss", "loss_total": "loss", "total_loss": "loss",
    "train/grad_norm": "grad_norm", "gradient_norm": "grad_norm", "grad_norm": "grad_norm",
}


def _seconds(clock: str) -> float | None:
    """`1:20:50` / `00:34` → seconds; `?` → None."""
    if not clock or clock == "?":
        return None
    total = 0.0
    for part in clock.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return total


def _bar(text: str) -> dict[str, float] | None:
    """The last tqdm bar of a training loop in text: step, total, it/s, eta_s (and its postfix's key=values)."""
    found = None
    for m in _BAR_RE.finditer(text):
        desc = text[: m.start(1)].rsplit("\r", 1)[-1]
        desc = desc.split("|", 1)[0] if "|" in desc else desc
        desc = re.sub(r"\d{1,3}%\s*$", "", desc.strip()).strip(" :")
        if desc and not _BAR_DESC_OK.search(desc):
            continue
        found = m
    if found is None:
        return None
    n, total, _elapsed, eta, rate, unit, post = found.groups()
    out: dict[str, float] = {"step": float(n), "total": float(total)}
    if rate != "?" and float(rate) > 0:
        out["it/s"] = float(rate) if unit.endswith("/s") else 1.0 / float(rate)
    eta_s = _seconds(eta)
    if eta_s is not None:
        out["eta_s"] = eta_s
    for key, num in _KV_RE.findall(post or ""):
        k = _KEY_ALIASES.get(key.lower(), key.lower())
        if k != "step":  # the bar's own count is the step (Lightning's global_step=3.2e+4 is rounded)
            out.setdefault(k, float(num))
    return out


class ProgressRegexError(ValueError):
    """A user's progress regex that cannot work (bad syntax, no named group we know)."""


CUSTOM_GROUPS = ("step", "total", "loss", "grad_norm", "lr", "epoch", "tok_s", "it_s", "eta_s")


def custom(pattern: str) -> re.Pattern[str]:
    """The user's own progress format: a regex with named groups among CUSTOM_GROUPS, e.g.
    `it (?P<step>\\d+) of (?P<total>\\d+) .* xent (?P<loss>[\\d.]+)`. Checked here, so a typo is a one-line
    error where it is given, not a silent miss."""
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ProgressRegexError(f"progress regex {pattern!r} does not compile: {e}") from None
    known = set(rx.groupindex) & set(CUSTOM_GROUPS)
    if not known:
        raise ProgressRegexError(f"progress regex {pattern!r} has none of the named groups "
                                 + ", ".join(f"(?P<{g}>…)" for g in CUSTOM_GROUPS))
    if rx.search("") is not None:
        raise ProgressRegexError(f"progress regex {pattern!r} matches an empty line: every line would be progress")
    return rx


def _custom_values(rx: re.Pattern[str], text: str) -> dict[str, float] | None:
    m = rx.search(text)
    if m is None:
        return None
    out: dict[str, float] = {}
    for name, value in m.groupdict().items():
        if name in CUSTOM_GROUPS and value is not None:
            try:
                out[{"tok_s": "tok/s", "it_s": "it/s"}.get(name, name)] = float(value.replace(",", ""))
            except ValueError:
                continue
    return out


def parse_progress(text: str, line: int, user: re.Pattern[str] | None = None) -> ProgressPoint | None:
    """A progress point when the line carries a step or a loss in one of the forms above (or the user's own)."""
    if user is not None:
        got = _custom_values(user, text)
        if got:
            return ProgressPoint(line=line, values=got, kind="train")
    if not any(k in text for k in PROGRESS_TOKENS):
        return None
    # a `k=v k=v …` line has no prefix to take off (split would find none: every prefix starts with `[`, `(`, `>`, a
    # digit, or a word followed by `:` or a space), so the thousand lines a one-shot status parses skip it
    plain = _PLAIN_KV_LINE_RE.fullmatch(text) is not None
    if not plain:
        text = split(text).body  # `[2023-07-25 21:03:17,269] [INFO] [logging.py:96:log_dist] step=35 …`
        plain = _PLAIN_KV_LINE_RE.fullmatch(text) is not None
    values: dict[str, float] = {}
    slash = "/" in text
    bar = _bar(text) if slash and "[" in text else None
    if bar is not None:
        values.update(bar)
    if "grad" in text.lower():
        m = _GRAD_NORM_RE.search(text)
        if m:
            values.setdefault("grad_norm", float(m.group(1)))
    if slash and (_digit_slash_digit(text) if plain else _DIGIT_SLASH_RE.search(text)):
        m = _OF_TOTAL_RE.search(text)
        if m and "step" not in values:
            values["step"], values["total"] = float(m.group(1)), float(m.group(2))
    for key, num in (_PLAIN_PAIR_RE if plain else _KV_RE).findall(text):
        k = key.lower()
        k = _KEY_ALIASES.get(k, k)
        if k not in values:
            values[k] = float(num)
    for key, num in () if plain else _SPACED_RE.findall(text):
        k = _KEY_ALIASES.get(key.lower(), key.lower())
        values.setdefault(k, float(num))
    if "step" in values and not values["step"].is_integer():  # DeepSpeed's timers: `step: 1172.13` (ms)
        del values["step"]
    for alias in ("steps", "batch"):  # DeepSpeed's `steps: 100 loss: 2.31`; `epoch 0 | batch 500 | loss: …`
        if "step" not in values and alias in values and "loss" in values and values[alias].is_integer():
            values["step"] = values[alias]
    if "loss" not in values and not ("step" in values and len(values) > 1):
        return None
    if "loss" in values and "loss_mean" not in values and ("ean" in text or "vg" in text or "verage" in text) \
            and _MEAN_LOSS_RE.search(text):  # (what it cannot match without: mean, avg, average in either case)
        values["loss_mean"] = values["loss"]  # `Mean Training loss : nan`: a later step's finite loss does not heal it
    return ProgressPoint(line=line, values=values, kind="eval" if _EVAL_RE.match(text) else "train")


def _digit_slash_digit(text: str) -> bool:
    """_DIGIT_SLASH_RE's answer for a `k=v k=v …` line, without its regex (a one-shot status parses a thousand such
    lines, `tok/s=` in each): a `/` there is inside a key, so no space is beside it and `\\d\\s*/\\s*\\d` is a digit, a
    slash, a digit (`\\d` is what str.isdecimal says)."""
    i = text.find("/", 1)
    while 0 < i < len(text) - 1:
        if text[i - 1].isdecimal() and text[i + 1].isdecimal():
            return True
        i = text.find("/", i + 1)
    return False


_STEP_FIRST = re.compile(r"\s*(?:step|iter)\b", re.IGNORECASE)


def is_training_step(line: str) -> bool:
    """A line saying a training step happened (what `launch --wait-for step` waits for): a progress line with a loss,
    or one that starts with its step (`step=12 …`, `iter 100: …`). `resume: continuing from checkpoint step=285` and
    `eval step=100 …` name a step but are not one."""
    point = parse_progress(line, 0)
    if point is None or point.kind != "train":
        return False
    return "loss" in point.values or ("step" in point.values and bool(_STEP_FIRST.match(line)))
