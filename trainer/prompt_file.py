"""Prompt files: the JSONL a data set is generated from (and `trainer.eval` decodes), and each prompt's token ids.

Each line holds `prompt` (text), `messages` (chat turns; a trailing assistant turn is dropped, the target writes
its own) or `ids` (token ids, for targets without a tokenizer). With a chat template the prompt is rendered through
it; without one, `prompt` is tokenized as is and `messages` as `role: content` lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.dataset import DataError
from trainer.jsonl import jsonl_objects


def load_prompts(path: str | Path) -> list[dict[str, Any]]:
    """Parse and check a prompt file; every problem names `file:line`."""
    path = Path(path)
    records = []
    for where, rec in jsonl_objects(path, DataError):
        if isinstance(rec.get("prompt"), str) and rec["prompt"]:
            pass
        elif isinstance(rec.get("messages"), list) and rec["messages"]:
            for m in rec["messages"]:
                if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                    raise DataError(f"{where}: each message needs string 'role' and 'content'")
        elif isinstance(rec.get("ids"), list) and rec["ids"] and all(isinstance(i, int) for i in rec["ids"]):
            pass
        else:
            raise DataError(f"{where}: needs a non-empty 'prompt' string, 'messages' list or 'ids' list")
        records.append(rec)
    if not records:
        raise DataError(f"{path}: no prompts")
    return records


def encode_prompt(tokenizer: Any, rec: dict[str, Any], thinking: bool | None = None) -> list[int]:
    """Token ids of one prompt, ready for the target to continue (chat template when the tokenizer has one).
    `thinking`: the template's `enable_thinking` (Qwen3); None leaves the template's default."""
    if "ids" in rec and "prompt" not in rec and "messages" not in rec:
        return [int(i) for i in rec["ids"]]
    if tokenizer is None:
        raise DataError("text prompts need a tokenizer (this target has none); give 'ids' instead")
    messages = rec.get("messages") or [{"role": "user", "content": rec["prompt"]}]
    while messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]  # the target writes the answer itself
    if getattr(tokenizer, "chat_template", None):
        extra = {} if thinking is None else {"enable_thinking": thinking}
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if "prompt" in rec:
        return list(tokenizer(rec["prompt"])["input_ids"])
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return list(tokenizer(text)["input_ids"])
