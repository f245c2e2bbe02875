"""The HTTP side of `trainer.data generate --server`: one OpenAI-compatible chat completion, retried.

`ServerSettings` holds what a request needs (endpoint, model, sampling, retries, timeout, backoff) and what the data
directory records of it (`sampling()`, and `key()`: what a resumed run must match). `ChatClient` is stdlib only
(urllib, one connection per request, thread-safe): connection errors, timeouts and HTTP 408/429/5xx are retried
with exponential backoff (a 429's Retry-After honoured, a little jitter so many threads spread out), any other
HTTP error fails at once; a failure for good is a `ServerError` whose message is one line. Proxy environment
variables are not used: the server is reached directly.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from trainer.dataset import DataError

MAX_BACKOFF_S = 60.0
THINKING = {"on": True, "off": False}


class ServerError(DataError):
    """A request that failed for good (retries exhausted, or an error not worth retrying); one line."""


class Stopped(Exception):
    """Another request failed for good: this one gave up before its next attempt."""


def chat_endpoint(url: str) -> str:
    """`http://host:30000`, `…/v1` or `…/v1/chat/completions` -> the chat completions URL; DataError otherwise."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DataError(f"--server {url!r} is not an http(s) URL; give one like http://127.0.0.1:30000")
    base = url.strip().rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


def server_label(url: str) -> str:
    """host:port of a URL (no user info, no path): what the data directory records."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port}" if parts.port else host


@dataclass
class ServerSettings:
    url: str  # the chat completions endpoint (chat_endpoint)
    model: str = ""  # the served model's name; "" = the first one the server lists (GET /v1/models)
    max_new_tokens: int = 4096
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.95
    thinking: bool | None = None  # None: the chat template's default (nothing is sent)
    seed: int | None = None  # None: the server's own randomness; else a seed per request (index, turn)
    shard_size: int = 64
    concurrency: int = 64  # conversations in flight
    retries: int = 6  # further attempts after the first
    timeout_s: float = 600.0  # per socket operation of a request
    backoff_s: float = 1.0  # first retry delay, doubled each retry (MAX_BACKOFF_S at most)

    def key(self) -> dict[str, Any]:
        """What must match for a resumed run to continue the same data (server address and concurrency do not)."""
        return {"backend": "server", "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "thinking": self.thinking, "seed": self.seed, "shard_size": self.shard_size}

    def sampling(self) -> dict[str, Any]:
        """meta.json `sampling`: the same keys as the Hugging Face path's (trainer/datagen.py)."""
        return {"backend": "server", "server": server_label(self.url), "model": self.model,
                "temperature": self.temperature, "top_p": self.top_p, "max_new_tokens": self.max_new_tokens,
                "thinking": "default" if self.thinking is None else self.thinking, "seed": self.seed,
                "concurrency": self.concurrency}

    def request_seed(self, index: int, turn: int) -> int | None:
        return None if self.seed is None else (self.seed * 1_000_003 + index * 1009 + turn) % 2**31


# ---- one request, retried ----------------------------------------------------------------------------------
def _retryable(e: BaseException) -> bool:
    if isinstance(e, urllib.error.HTTPError):
        return e.code in (408, 429) or e.code >= 500
    return isinstance(e, (urllib.error.URLError, OSError, http.client.HTTPException, ValueError))


def _describe(e: BaseException, timeout_s: float) -> str:
    if isinstance(e, urllib.error.HTTPError):
        try:
            body = e.read(300).decode("utf-8", "replace")
        except Exception:
            body = ""
        return " ".join(f"HTTP {e.code} {e.reason} {body}".split())[:300]
    if isinstance(e, TimeoutError) or "timed out" in str(e):
        return f"timed out after {timeout_s:g} s"
    reason = getattr(e, "reason", None) or e
    return " ".join(f"{type(reason).__name__}: {reason}".split())[:300]


class ChatClient:
    """JSON over HTTP with retries; thread-safe (one connection per request)."""

    def __init__(self, settings: ServerSettings, stop: threading.Event) -> None:
        self.settings, self.stop = settings, stop
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.lock = threading.Lock()
        self.requests = self.retried = 0

    def call(self, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The reply's JSON object; ServerError(last error) once the attempts are spent, Stopped on stop."""
        s, last, last_exc = self.settings, "", None
        for attempt in range(s.retries + 1):
            if attempt:
                with self.lock:
                    self.retried += 1
                if self.stop.wait(self._delay(attempt, last_exc)):
                    raise Stopped
            data = None if body is None else json.dumps(body).encode()
            req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                         method="GET" if body is None else "POST")
            with self.lock:
                self.requests += 1
            try:
                with self.opener.open(req, timeout=s.timeout_s) as resp:
                    reply = json.loads(resp.read())
                if not isinstance(reply, dict):
                    raise ValueError("the reply is not a JSON object")
                return reply
            except Exception as e:
                last_exc, last = e, _describe(e, s.timeout_s)
                if not _retryable(e):
                    raise ServerError(last) from None
        raise ServerError(f"{last} (after {s.retries + 1} attempts)")

    def _delay(self, attempt: int, e: BaseException | None) -> float:
        delay = min(self.settings.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
        after = e.headers.get("Retry-After") if isinstance(e, urllib.error.HTTPError) and e.headers else None
        if after and after.strip().isdigit():
            delay = max(delay, min(float(after), MAX_BACKOFF_S))
        return delay * (1 + 0.1 * random.random())  # a little jitter: retries of many threads spread out

    def first_model(self) -> str:
        url = self.settings.url.removesuffix("/chat/completions") + "/models"
        try:
            data = self.call(url).get("data")
        except ServerError as e:
            raise ServerError(f"{url}: cannot list the served models ({e}); is the server up? (or give --model)") \
                from None
        if not (isinstance(data, list) and data and isinstance(data[0], dict) and data[0].get("id")):
            raise ServerError(f"{url}: lists no model; give --model NAME")
        return str(data[0]["id"])

    def complete(self, messages: list[dict[str, str]], seed: int | None) -> tuple[str, str, bool]:
        """(content, full text incl. reasoning, stopped by itself) of one chat completion."""
        s = self.settings
        body: dict[str, Any] = {"model": s.model, "messages": messages, "max_tokens": s.max_new_tokens,
                                "temperature": s.temperature, "top_p": s.top_p, "stream": False}
        if s.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": s.thinking}
        if seed is not None:
            body["seed"] = seed
        reply = self.call(s.url, body)
        try:
            choice = reply["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            stopped = choice.get("finish_reason") == "stop"
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ServerError(f"not a chat.completion reply: {json.dumps(reply)[:200]}") from None
        full = f"<think>\n{reasoning}\n</think>\n\n{content}" if reasoning else content
        return content, full, stopped
