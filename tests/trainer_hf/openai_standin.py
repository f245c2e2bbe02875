"""An OpenAI-compatible stand-in for SGLang / vLLM: the tiny Hugging Face target behind `/v1/chat/completions`.

It does what those servers do with a chat request: applies the checkpoint's chat template to `messages` (with
`chat_template_kwargs`, e.g. `enable_thinking`), generates (greedy at temperature 0, else sampled with the request's
seed), and answers a `chat.completion` (content = the decoded reply, finish_reason "stop" at EOS, else "length").
`GET /v1/models` lists the one model. It listens on 127.0.0.1, port 0, a `ThreadingHTTPServer` in a thread.

A test scripts failures with `policy(n, body)`, called for the n-th chat request (from 0, arrival order): None
serves it, an int answers with that HTTP status, "hang" holds the request until `release` is set and then closes
it unanswered (past the client's timeout without a long sleep). `reasoning` set: replies carry it as
`reasoning_content` (what a server with a reasoning parser returns). `log` keeps every chat request: its number,
body and what was answered.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Policy = Callable[[int, dict[str, Any]], "int | str | None"]


class OpenAIStandIn:
    def __init__(self, model_dir: Path, name: str = "tiny-target") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from trainer.hf import load_tokenizer

        self.name = name
        self.tokenizer = load_tokenizer(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True,
                                                          dtype=torch.float32).eval()
        self.log: list[dict[str, Any]] = []
        self.policy: Policy | None = None
        self.reasoning: str | None = None
        self.release = threading.Event()
        self._lock = threading.Lock()  # log order and one generation at a time
        self._server: ThreadingHTTPServer | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> OpenAIStandIn:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: the test reads `log`
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": standin.name, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                with standin._lock:
                    entry = {"n": len(standin.log), "body": body, "status": None, "reply": None}
                    standin.log.append(entry)
                action = standin.policy(entry["n"], body) if standin.policy else None
                if action == "hang":
                    entry["status"] = "hang"
                    standin.release.wait(60)  # the test sets it; 60 s only so a broken test cannot hang forever
                    self.close_connection = True
                    return
                if isinstance(action, int):
                    entry["status"] = action
                    self._send(action, {"error": {"message": f"scripted failure {action}", "code": action}})
                    return
                reply = standin.answer(body)
                entry["status"], entry["reply"] = 200, reply["choices"][0]["message"]["content"]
                self._send(200, reply)

            def _send(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="openai-standin", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def reset(self) -> None:
        """Between tests: serve everything again, forget the log, let go of any held request."""
        self.release.set()
        self.policy = None
        self.reasoning = None
        self.log = []
        self.release = threading.Event()

    def close(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # ---- answering ------------------------------------------------------------------------------------------
    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        import torch

        tok = self.tokenizer
        temperature = float(body.get("temperature", 1.0))
        kwargs: dict[str, Any] = {"max_new_tokens": int(body.get("max_tokens") or 16),
                                  "pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}
        if temperature > 0:
            kwargs |= {"do_sample": True, "temperature": temperature, "top_p": float(body.get("top_p", 1.0)),
                       "top_k": 0}
        else:
            kwargs |= {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        with self._lock, torch.no_grad():  # the tokenizer too: a fast tokenizer is not to be shared by threads
            text = tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False,
                                           **(body.get("chat_template_kwargs") or {}))
            prompt = list(tok(text, add_special_tokens=False)["input_ids"])
            if temperature > 0:
                torch.manual_seed(int(body.get("seed") or 0))
            ids = torch.tensor([prompt])
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
            out = out[0, len(prompt):].tolist()
            stopped = tok.eos_token_id in out
            if stopped:
                out = out[: out.index(tok.eos_token_id)]
            message = {"role": "assistant", "content": tok.decode(out, skip_special_tokens=True)}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        return {"id": f"chatcmpl-{len(self.log)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or self.name,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "stop" if stopped else "length"}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out) + stopped,
                          "total_tokens": len(prompt) + len(out) + stopped}}
