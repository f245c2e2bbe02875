"""Target-generated data from a server: the prompts go to an OpenAI-compatible `/v1/chat/completions` endpoint
(SGLang or vLLM serving the target) instead of Hugging Face `generate` — the way to hundreds of thousands of samples.

`python -m trainer.data generate --server URL --target DIR --prompts FILE.jsonl --out DIR [--concurrency 64]
[--retries 6] [--timeout 600] [--thinking on|off] [--temperature 0.7] [--max-new-tokens 4096] [--model NAME]`

- **Token ids.** The server answers in text; the sample's ids come from the target's own tokenizer (`--target DIR`:
  tokenizer files and config.json, no weights are loaded, no GPU is needed). The prompt is the conversation so far
  rendered through the chat template with the generation prompt (and `enable_thinking` when `--thinking` is
  given: the same switch the request carries as `chat_template_kwargs`); the response is the reply text
  tokenized, plus the tokenizer's EOS token when the server stopped by itself (`finish_reason` "stop"). A reply
  split by a server-side reasoning parser (`reasoning_content`) is joined back as `<think>\\n…\\n</think>\\n\\n…`;
  a server without a reasoning parser returns the text exactly as generated.
- **Multi-turn.** A `messages` record is replayed turn by turn: after each user turn that the record answers (it is
  followed by an assistant turn, or it is the last turn), the server writes a reply to the conversation so far, and
  that *regenerated* reply — not the record's original assistant turn, which is discarded — is what the next
  turn's request carries. Each regenerated reply is one sample (prompt = the conversation up to that turn,
  response = the reply), stored under the prompt's index (its position in the prompt file, from 0), in turn order.
  A `prompt` record is one user turn. `ids` records need the Hugging Face path (a server takes text).
- **Concurrency.** `--concurrency` daemon worker threads, each one conversation at a time (its turns in order);
  the main thread feeds them in prompt order, tokenizes the replies (tokenizers are not shared across threads) and
  writes each shard when its prompts are all answered (atomically: trainer/dataset.py `write_shard`).
- **Failures.** Connection errors, timeouts (`--timeout` seconds per socket operation) and HTTP 408/429/5xx are
  retried `--retries` times with exponential backoff (`--backoff` seconds doubling, at most 60; a 429's
  Retry-After is honoured); any other HTTP error fails at once. A request that fails for good stops the feeding and
  every further retry, lets the conversations in flight finish (every shard they complete is written), then ends
  with one line naming the URL, the prompt and the last error (exit 2). Rerunning the same command resumes at the
  missing shards. Proxy environment variables are not used: the server is reached directly.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
from pathlib import Path
from typing import Any, TextIO

from trainer.chat_client import THINKING, ChatClient, ServerError, ServerSettings, Stopped, chat_endpoint, server_label
from trainer.checkpoint import atomic_write_bytes
from trainer.datagen_common import ProgressBar, check_resume
from trainer.dataset import FORMAT, DataError, shard_path, summarize, write_shard
from trainer.oneline import first_line
from trainer.prompt_file import encode_prompt, load_prompts

# ---- command line (trainer/datagen.py parses; these are the server's options) ---------------------------------
SERVER_ONLY = ("model", "concurrency", "retries", "timeout", "backoff")


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server (instead of Hugging Face generate)")
    g.add_argument("--server", metavar="URL", default=None,
                   help="OpenAI-compatible server of the target (SGLang, vLLM): http://HOST:PORT[/v1]")
    g.add_argument("--model", metavar="NAME", default=None, help="served model name (default: the first listed)")
    g.add_argument("--concurrency", type=int, default=None, help="conversations in flight (default 64)")
    g.add_argument("--retries", type=int, default=None, help="further attempts per request (default 6)")
    g.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds per socket operation of a request (default 600)")
    g.add_argument("--backoff", type=float, default=None, metavar="S",
                   help="first retry delay, doubled each retry (default 1)")


def server_settings(args: argparse.Namespace) -> ServerSettings:
    """ServerSettings from parsed arguments; DataError names the bad option."""
    d = ServerSettings(url=chat_endpoint(args.server))
    s = ServerSettings(
        url=d.url, model=args.model or "", max_new_tokens=args.max_new_tokens or d.max_new_tokens,
        temperature=d.temperature if args.temperature is None else args.temperature, top_p=args.top_p,
        thinking=None if args.thinking is None else THINKING[args.thinking], seed=args.seed,
        shard_size=args.shard_size, concurrency=d.concurrency if args.concurrency is None else args.concurrency,
        retries=d.retries if args.retries is None else args.retries,
        timeout_s=d.timeout_s if args.timeout is None else args.timeout,
        backoff_s=d.backoff_s if args.backoff is None else args.backoff)
    for flag, ok in (("--max-new-tokens must be >= 1", s.max_new_tokens >= 1),
                     ("--shard-size must be >= 1", s.shard_size >= 1),
                     ("--concurrency must be >= 1", s.concurrency >= 1),
                     ("--retries must be >= 0", s.retries >= 0),
                     ("--timeout must be > 0", s.timeout_s > 0),
                     ("--backoff must be >= 0", s.backoff_s >= 0),
                     ("--temperature must be >= 0", s.temperature >= 0),
                     ("--top-p must be in (0, 1]", 0 < s.top_p <= 1)):
        if not ok:
            raise DataError(flag)
    return s


# ---- conversations ------------------------------------------------------------------------------------------
Turn = tuple[list[dict[str, str]], str, bool]  # (conversation sent, reply text incl. reasoning, stopped)


def conversation(rec: dict[str, Any]) -> list[dict[str, str]]:
    return rec.get("messages") or [{"role": "user", "content": rec["prompt"]}]


def answered_turns(messages: list[dict[str, str]]) -> int:
    """How many replies a record asks for: user turns followed by an assistant turn or ending the record."""
    return sum(1 for j, m in enumerate(messages) if m["role"] == "user"
               and (j + 1 == len(messages) or messages[j + 1]["role"] == "assistant"))


def converse(client: ChatClient, rec: dict[str, Any], index: int) -> list[Turn]:
    """Regenerate every assistant turn of one record, in order, each request carrying the earlier regenerated
    replies (the record's own assistant turns are dropped)."""
    messages, sent, turns = conversation(rec), [], []
    multi = answered_turns(messages) > 1
    for j, m in enumerate(messages):
        if m["role"] == "assistant":
            continue
        sent.append({"role": m["role"], "content": m["content"]})
        if m["role"] != "user" or (j + 1 < len(messages) and messages[j + 1]["role"] != "assistant"):
            continue
        try:
            content, full, stopped = client.complete(list(sent), client.settings.request_seed(index, len(turns)))
        except ServerError as e:
            where = f"prompt {index}" + (f" turn {len(turns) + 1}" if multi else "")
            raise ServerError(f"{client.settings.url}: {where}: {e}") from None
        turns.append((list(sent), full, stopped))
        sent.append({"role": "assistant", "content": content})
    return turns


def _check_records(records: list[dict[str, Any]], prompts_path: str | Path) -> None:
    for i, rec in enumerate(records):
        if "prompt" not in rec and "messages" not in rec:
            raise DataError(f"{prompts_path}: prompt {i} holds token ids; a server takes text (drop --server to "
                            "generate from 'ids' with Hugging Face)")
        if not answered_turns(conversation(rec)):
            raise DataError(f"{prompts_path}: prompt {i} has no user turn to answer")


# ---- the data directory -------------------------------------------------------------------------------------
def _worker(client: ChatClient, records: list[dict[str, Any]], jobs: queue.Queue, results: queue.Queue) -> None:
    """One conversation at a time until the None sentinel; every outcome (turns or the error) goes to results.
    Once a request has failed for good (client.stop), queued conversations are not started."""
    while (i := jobs.get()) is not None:
        if client.stop.is_set():
            results.put((i, Stopped()))
            continue
        try:
            results.put((i, converse(client, records[i], i)))
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which decides
            results.put((i, e))


def _load_target(target_path: str) -> tuple[Any, dict[str, Any]]:
    from trainer.hf import load_tokenizer
    from trainer.hf_config import HFConfigError, read_json_object, target_dims

    try:
        dims = target_dims(target_path)
    except HFConfigError as e:
        raise DataError(str(e)) from None
    try:
        tokenizer = load_tokenizer(target_path)
    except Exception as e:  # transformers raises OSError/ValueError/... for a missing or broken tokenizer
        raise DataError(f"{target_path}: cannot load the tokenizer ({first_line(e)})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{target_path}: the tokenizer has no chat template; a chat server needs one")
    gen = Path(target_path) / "generation_config.json"
    eos = read_json_object(gen, DataError, missing="").get("eos_token_id") if gen.exists() else None
    eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.insert(0, int(tokenizer.eos_token_id))
    return tokenizer, {"eos_token_ids": eos_ids, "vocab_size": dims["vocab_size"],
                       "mask_token_id": dims["vocab_size"] - 1}


def generate_via_server(target_path: str, prompts_path: str | Path, out: str | Path, settings: ServerSettings,
                        limit: int = 0, stream: TextIO | None = None) -> dict[str, Any]:
    """Generate (or resume) a data directory from a server; returns its meta. Raises DataError on bad input and
    ServerError when a request fails for good (the shards completed before are kept)."""
    out = Path(out)
    records = load_prompts(prompts_path)[: limit or None]
    _check_records(records, prompts_path)
    tokenizer, ids = _load_target(target_path)
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else (ids["eos_token_ids"] or [None])[0]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (ids["eos_token_ids"] or [0])[0]
    stop = threading.Event()
    client = ChatClient(settings, stop)
    if not settings.model:
        settings.model = client.first_model()
    meta = {"format": FORMAT, "target": str(Path(target_path).resolve()), "prompts": str(Path(prompts_path).resolve()),
            "num_prompts": len(records), "generation": settings.key(), "sampling": settings.sampling(),
            "sample_unit": "one sample per assistant turn (prompt: the conversation up to it)", **ids,
            "pad_token_id": pad_id, "chat_template": True}
    check_resume(out, meta)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "meta.json", json.dumps(meta, indent=1).encode())
    size = settings.shard_size
    n_shards = -(-len(records) // size)
    todo = [k for k in range(n_shards) if not shard_path(out, k).exists()]
    done = len(records) - sum(min(size, len(records) - k * size) for k in todo)
    bar = ProgressBar(len(records), done, stream)
    if done:
        print(f"resume: {n_shards - len(todo)}/{n_shards} shards already in {out}", file=bar.stream, flush=True)
    indices = iter([i for k in todo for i in range(k * size, min(len(records), (k + 1) * size))])
    jobs: queue.Queue = queue.Queue()
    results: queue.Queue = queue.Queue()
    threads = [threading.Thread(target=_worker, args=(client, records, jobs, results), daemon=True,
                                name=f"datagen-client-{n}") for n in range(settings.concurrency)]
    for t in threads:
        t.start()
    answered: dict[int, dict[int, list[Turn]]] = {}  # shard -> prompt index -> turns
    in_flight, unreported, failure = 0, 0, None
    every = max(1, min(size, settings.concurrency))
    try:
        while True:
            while failure is None and in_flight < 2 * settings.concurrency and (i := next(indices, None)) is not None:
                jobs.put(i)
                in_flight += 1
            if not in_flight:
                break
            i, res = results.get()
            in_flight -= 1
            if isinstance(res, BaseException):
                if failure is None and not isinstance(res, Stopped):
                    failure = res
                    stop.set()  # nothing new starts; what is in flight finishes, its shards are written
                continue
            k = i // size
            answered.setdefault(k, {})[i] = res
            if len(answered[k]) == min(size, len(records) - k * size):
                shard = answered.pop(k)
                rows = [(j, turn) for j in sorted(shard) for turn in shard[j]]
                write_shard(shard_path(out, k), [j for j, _ in rows],
                            [_sample(tokenizer, turn, settings.thinking, eos_id) for _, turn in rows])
            unreported += 1
            if unreported >= every or not in_flight:
                bar.update(unreported)
                unreported = 0
    finally:
        stop.set()
        for _ in threads:
            jobs.put(None)
    bar.close()
    if failure is not None:
        raise failure  # a ServerError is one line; anything else is a bug and keeps its traceback
    print(f"server {server_label(settings.url)}: {client.requests} requests, {client.retried} retried",
          file=bar.stream, flush=True)
    meta["summary"] = summarize(out)
    atomic_write_bytes(out / "meta.json", json.dumps(meta, indent=1).encode())
    return meta


def _sample(tokenizer: Any, turn: Turn, thinking: bool | None,
            eos_id: int | None) -> tuple[list[int], list[int], bool]:
    """(prompt ids, response ids, ended with EOS) of one regenerated turn, in the target's own tokens."""
    sent, text, stopped = turn
    response = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if stopped and eos_id is not None:
        response.append(int(eos_id))
    return encode_prompt(tokenizer, {"messages": sent}, thinking), response, stopped and eos_id is not None
