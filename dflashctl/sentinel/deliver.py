"""How one notification payload (notify.compose) reaches one target: the wire format of each target kind and what
counts as failure. Each `deliver_*` returns on success and raises DeliveryError (one line) otherwise — any non-2xx
status, a refused connection, a timeout, a command's non-zero exit. Retries, batching and threads are notify.py's.

Stdlib only: this runs in the container next to the training run.

Proxies: the environment's http(s)_proxy / no_proxy are honoured as urllib does, except that a loopback target
(127.0.0.0/8, ::1, localhost) is always reached directly — a proxy outside the container cannot reach the
container's own loopback. Redirects: urllib's rules, plus a 307/308 answer to a POST repeats the POST with its body
(RFC 7538) instead of failing.

A URL with credentials (`https://user:pass@host/…`) works as curl makes it work: they travel as an
`Authorization: Basic` header (urllib alone would take them for part of the host name), never to another host a
redirect points at, and `redact` keeps them — and a URL's path and query, which hold Slack's and ntfy's tokens —
out of every error line (events.jsonl, status, the sentinel's log). Issue 26.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Mapping
from http.client import HTTPException
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import unquote, urlsplit, urlunsplit

from dflashctl.analysis.watchspec import NotifyTarget, where

URGENT_KINDS = ("worker-crashed", "policy", "stalled")
FAILED_VERDICTS = ("crashed", "lost", "stopped")
_ENV_JSON_MAX = 100_000  # one environment string may be at most 128 KiB on Linux (MAX_ARG_STRLEN)
_ERROR_CHARS = 200


class DeliveryError(Exception):
    """A delivery that did not happen; str() is one short line for events.jsonl and on_failure."""


def one_line(text: object, limit: int = _ERROR_CHARS) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def text_of(payload: Mapping[str, Any]) -> str:
    """The few lines a person reads (Slack, ntfy): the cause first (signature, worker, traceback tail, what to do;
    issue 28), then what happened, how to look further."""
    cause = [str(x) for x in payload.get("cause") or ()]
    title = str(payload.get("title") or payload.get("kind") or "event")
    lines = [*cause, title]
    message = payload.get("message")
    if message and message != title:
        lines.append(str(message))
    if payload.get("remedy") and not any(x.startswith("what to do:") for x in cause):
        lines.append(f"remedy: {payload['remedy']}")
    more = int(payload.get("count") or 1) - 1
    if more > 0:
        lines.append(f"+{more} more event{'s' if more != 1 else ''}")
    if payload.get("command"):
        lines.append(f"look: {payload['command']}")
    return "\n".join(lines)


def is_failure(payload: Mapping[str, Any]) -> bool:
    """Does the message need a person now: a crash, a stop by policy, a stall, or a run that ended badly."""
    return payload.get("kind") in URGENT_KINDS or (payload.get("kind") == "ended"
                                                   and payload.get("verdict") in FAILED_VERDICTS)


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _DirectToLoopback(urllib.request.ProxyHandler):
    """The environment's proxies, but never for a loopback host (see the module docstring)."""

    def proxy_open(self, req: urllib.request.Request, proxy: str, proxy_type: str) -> Any:
        if _is_loopback(urlsplit(req.full_url).hostname):
            return None
        return super().proxy_open(req, proxy, proxy_type)


class _RepostOn307(urllib.request.HTTPRedirectHandler):
    """307/308 keep the method and body (RFC 7538); urllib would refuse them for a POST."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        same_host = urlsplit(newurl).hostname == urlsplit(req.full_url).hostname
        if not same_host:  # credentials go to the host they were written for, never on (curl's rule)
            req.remove_header("Authorization")
        if code in (307, 308) and req.get_method() == "POST":
            headers = {k: v for k, v in req.header_items() if k.lower() not in ("host", "content-length")}
            return urllib.request.Request(newurl.replace(" ", "%20"), data=req.data, headers=headers, method="POST",
                                          origin_req_host=req.origin_req_host, unverifiable=True)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def credentials(url: str) -> tuple[str, dict[str, str]]:
    """(url without its `user:password@`, the Authorization header they make; {} when it has none)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    token = base64.b64encode(f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()).decode()
    return urlunsplit(parts._replace(netloc=netloc)), {"Authorization": f"Basic {token}"}


def redact(text: str, target: NotifyTarget) -> str:
    """text with the secret parts of target's URL (user:password, the password, the path, the query) replaced by
    `…`: the one rule for every line that shows or logs a notify target's doing (NotifyTarget.label names it)."""
    if not target.url:
        return text
    parts = urlsplit(target.url)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    for whole in sorted({target.url, credentials(target.url)[0]}, key=len, reverse=True):
        text = text.replace(whole, where(target.url) + "/…")  # the URL itself: as its label shows it
    secrets = {userinfo, unquote(userinfo), parts.query, unquote(parts.query),
               parts.path if parts.path not in ("", "/") else "", unquote(parts.path) if parts.path not in ("", "/")
               else ""}
    password = unquote(parts.password or "")
    if len(password) >= 4:  # a shorter one would blot out ordinary words
        secrets |= {password, parts.password or ""}
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "…")
    return text


def post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> int:
    """POST body; the 2xx status, else DeliveryError. timeout bounds each connect / read (socket timeout). A URL's
    credentials go as an Authorization header; errors name only scheme://host:port."""
    opener = urllib.request.build_opener(_DirectToLoopback(), _RepostOn307())  # per call: reads the env now
    url, auth = credentials(url)
    request = urllib.request.Request(url, data=body, headers={**headers, **auth}, method="POST")
    try:
        with opener.open(request, timeout=timeout) as response:
            response.read(65536)
            status = int(response.status)
    except HTTPError as e:
        try:
            detail = one_line(e.read(300).decode("utf-8", "replace"), 120)
        except Exception:  # the status is the news; the body is a courtesy
            detail = ""
        raise DeliveryError(f"HTTP {e.code} {e.reason}" + (f": {detail}" if detail else "")) from None
    except URLError as e:
        raise DeliveryError(one_line(f"cannot reach {where(url)}: {e.reason}")) from None
    except (TimeoutError, OSError, HTTPException, ValueError) as e:
        raise DeliveryError(one_line(f"{where(url)}: {type(e).__name__}: {e}")) from None
    if not 200 <= status < 300:
        raise DeliveryError(f"HTTP {status}")
    return status


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, default=str, ensure_ascii=False).encode("utf-8")


def deliver_webhook(target: NotifyTarget, payload: Mapping[str, Any], timeout: float) -> None:
    post(str(target.url), _json_bytes(payload), {"Content-Type": "application/json"}, timeout)


def deliver_slack(target: NotifyTarget, payload: Mapping[str, Any], timeout: float) -> None:
    """A Slack-compatible incoming webhook (also Mattermost, Rocket.Chat, Discord's /slack endpoint)."""
    post(str(target.url), _json_bytes({"text": text_of(payload)}), {"Content-Type": "application/json"}, timeout)


def latin1(text: str) -> str:
    """HTTP header values travel as latin-1 (http.client): what is not latin-1 becomes '?'."""
    return " ".join(text.split()).encode("latin-1", "replace").decode("latin-1")


def _ntfy_tags(payload: Mapping[str, Any]) -> str:
    if is_failure(payload) or payload.get("kind") in ("idle-gpus", "signature"):
        return "warning"
    return {"ended": "white_check_mark", "restart": "repeat", "first-step": "arrow_forward"}.get(
        str(payload.get("kind")), "information_source")


def ntfy_priority(payload: Mapping[str, Any]) -> str:
    """urgent for a crashed worker, high for a stop, a stall or a run that ended badly, default otherwise."""
    if payload.get("kind") == "worker-crashed":
        return "urgent"
    return "high" if is_failure(payload) else "default"


def deliver_ntfy(target: NotifyTarget, payload: Mapping[str, Any], timeout: float) -> None:
    """ntfy's publish-as-POST: the text is the body, the rest headers (https://docs.ntfy.sh/publish/)."""
    headers = {"Content-Type": "text/plain; charset=utf-8", "Title": latin1(str(payload.get("title") or "")),
               "Priority": ntfy_priority(payload), "Tags": _ntfy_tags(payload)}
    post(str(target.url), text_of(payload).encode("utf-8"), headers, timeout)


def deliver_command(target: NotifyTarget, payload: Mapping[str, Any], timeout: float) -> None:
    """`/bin/sh -c COMMAND`, the payload JSON on stdin and in DFLASH_EVENT_JSON (without the event list when that
    would pass the kernel's limit on one environment string). Run in its own session so a timeout kills what it
    started too."""
    data = json.dumps(payload, default=str)
    env_json = data if len(data) <= _ENV_JSON_MAX else json.dumps({**payload, "events": []}, default=str)
    env = {**os.environ, "DFLASH_EVENT_KIND": str(payload.get("kind") or ""),
           "DFLASH_EVENT_RUN": str(payload.get("run") or ""), "DFLASH_EVENT_TITLE": str(payload.get("title") or ""),
           "DFLASH_EVENT_JSON": env_json[:_ENV_JSON_MAX]}
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", str(target.command)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    except OSError as e:
        raise DeliveryError(one_line(f"cannot start /bin/sh: {e}")) from None
    try:
        out, err = proc.communicate(data.encode("utf-8"), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise DeliveryError(f"timed out after {timeout:g} s (killed)") from None
    if proc.returncode != 0:
        said = (err or out or b"").decode("utf-8", "replace").strip().splitlines()
        raise DeliveryError(one_line(f"exit {proc.returncode}" + (f": {said[-1]}" if said else "")))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # reap it (no init reaps zombies in our containers);
        proc.communicate(timeout=2.0)  # ... a grandchild holding the pipes must not block us


DELIVER: dict[str, Callable[[NotifyTarget, Mapping[str, Any], float], None]] = {
    "webhook": deliver_webhook, "slack": deliver_slack, "ntfy": deliver_ntfy, "command": deliver_command,
}


def deliver(target: NotifyTarget, payload: Mapping[str, Any], timeout: float) -> None:
    """Send payload to target by its kind; DeliveryError on failure."""
    try:
        fn = DELIVER[target.kind]
    except KeyError:
        raise DeliveryError(f"unknown target kind {target.kind!r}") from None
    fn(target, payload, timeout)
