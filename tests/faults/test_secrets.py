"""Secrets stay secret (issue 26 part 3): a run directory is its owner's only (0700) and the files that hold --env
values and notify URLs (launch.json, launch_spec.json) are 0600; a notify URL with credentials works — basic auth
sent as an Authorization header — and neither the password, the URL's token nor an env value shows in any file
others may read, events.jsonl, the sentinel's log, `status --json` or `logs --events`, whether the delivery works
or fails. A real HTTP receiver on loopback (tests/sentinel/receiver.py), the run's real sentinel."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from lifecycle.conftest import _no_run_outlives_its_test  # noqa: F401 - autouse: no run outlives its test
from sentinel.receiver import Receiver

from dflashctl.analysis.watchspec import parse_target
from dflashctl.sentinel.deliver import credentials, redact, where

pytestmark = [pytest.mark.timeout(300)]

PASSWORD, TOKEN, ENV_VALUE = "pa55word-Q7", "tok-abc123", "hunter2-xyz"
SECRETS = (PASSWORD, TOKEN, ENV_VALUE)


def _launch(cli, tmp_path: Path, url: str | None) -> tuple[str, Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "job.sh").write_text("echo step 1/1\n")
    notify = ["--notify", url, "--notify-on", "ended"] if url else ["--no-sentinel"]
    res = cli("launch", "--exec", "--source", str(src), "--name", "secret", "--env", f"API_KEY={ENV_VALUE}",
              *notify, "--wait-for", "exit", "--json", "--", "sh", "-c", "echo working; sleep 0.5")
    assert res.code == 0, res.err
    return res.json()["run_id"], Path(res.json()["run_dir"])


def _no_secret_anywhere_but_the_private_files(cli, run_id: str, run_dir: Path) -> None:
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for private in ("launch.json", "launch_spec.json"):
        assert stat.S_IMODE((run_dir / private).stat().st_mode) == 0o600, private
    for f in run_dir.rglob("*"):
        if f.is_file() and f.name not in ("launch.json", "launch_spec.json", "agent.pyz"):
            text = f.read_bytes().decode("utf-8", "replace")
            assert not [s for s in SECRETS if s in text], (f.name, text[-2000:])
    for argv in (("status", run_id, "--json"), ("logs", run_id, "--events", "--json"), ("logs", run_id, "--events"),
                 ("runs", "--json")):
        res = cli(*argv)
        assert not [s for s in SECRETS if s in res.out + res.err], (argv, res.out[-2000:])


def test_the_run_directory_is_private_and_env_values_stay_in_its_0600_files(local_host, cli, tmp_path):
    run_id, run_dir = _launch(cli, tmp_path, None)
    assert ENV_VALUE in (run_dir / "launch.json").read_text()  # the supervisor needs it: kept, but private
    _no_secret_anywhere_but_the_private_files(cli, run_id, run_dir)


def test_a_notify_url_with_credentials_is_delivered_with_basic_auth_and_shown_nowhere(local_host, cli, tmp_path):
    with Receiver("ok") as rx:
        url = f"http://alice:{PASSWORD}@127.0.0.1:{rx.port}/hook?token={TOKEN}"
        run_id, run_dir = _launch(cli, tmp_path, url)
        rx.wait_for(lambda msgs: any(m.get("kind") == "ended" for m in msgs), what="the ended message")
        (req,) = [r for r in rx.requests if r.json().get("kind") == "ended"]
    assert req.path == f"/hook?token={TOKEN}"
    assert req.headers["Authorization"] == "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    _no_secret_anywhere_but_the_private_files(cli, run_id, run_dir)


def test_a_failing_delivery_to_a_url_with_credentials_records_no_secret(local_host, cli, tmp_path):
    from harness.poll import wait_until

    with Receiver("error") as rx:
        url = f"http://alice:{PASSWORD}@127.0.0.1:{rx.port}/hook?token={TOKEN}"
        run_id, run_dir = _launch(cli, tmp_path, url)
        wait_until(lambda: "notify-failed" in (run_dir / "events.jsonl").read_text(), 90, "the notify-failed event")
    assert rx.requests and all(r.headers.get("Authorization", "").startswith("Basic ") for r in rx.requests)
    _no_secret_anywhere_but_the_private_files(cli, run_id, run_dir)


def test_redact_is_one_rule_for_every_secret_part_of_a_url():
    t = parse_target(f"https://bob:{PASSWORD}@hooks.example.invalid:8443/services/T0/B1/{TOKEN}?key={TOKEN}")
    line = f"cannot reach {t.url}: refused (bob:{PASSWORD}@hooks… /services/T0/B1/{TOKEN} key={TOKEN})"
    out = redact(line, t)
    assert not [s for s in SECRETS if s in out] and "hooks.example.invalid" in out, out
    assert where(t.url or "") == "https://hooks.example.invalid:8443"
    bare, header = credentials(t.url or "")
    assert bare == f"https://hooks.example.invalid:8443/services/T0/B1/{TOKEN}?key={TOKEN}"
    assert header == {"Authorization": "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()}
    assert credentials("https://hooks.example.invalid/x") == ("https://hooks.example.invalid/x", {})
    assert PASSWORD not in t.label and TOKEN not in t.label


# ------------------------------------------------- the sentinel's notifier in-process, against a real HTTP receiver


def _ended(run: str = "run-1"):  # noqa: ANN202
    from dflashctl.analysis.events import Event

    return Event(t=1.0, kind="ended", run=run, verdict="finished", message="the run ended: finished")


@pytest.mark.parametrize("mode", ["ok", "error", "closed"])
def test_the_notifier_sends_basic_auth_and_its_failure_records_hold_no_secret(mode):
    from dflashctl.sentinel.notify import Notifier

    failures: list[dict] = []
    with Receiver(mode) as rx:
        target = parse_target(f"http://alice:{PASSWORD}@127.0.0.1:{rx.port}/hook?token={TOKEN}")
        if mode == "closed":
            rx.close()
        n = Notifier([target], ["ended"], "pve", on_failure=failures.append, gather_s=0.0, retries=2,
                     backoff_s=(0.0,), timeout_s=10.0)
        n.submit(_ended())
        delivered = n.flush(60.0)
        n.close()
        requests = rx.requests
    assert delivered is (mode == "ok"), failures
    if mode != "closed":
        assert requests and {r.path for r in requests} == {f"/hook?token={TOKEN}"}
        assert {r.headers.get("Authorization") for r in requests} == {
            "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()}
    if mode != "ok":
        (failure,) = failures
        assert failure["target"] == f"webhook http://127.0.0.1:{rx.port}/…"
        assert not [s for s in SECRETS if s in repr(failure)], failure


def test_credentials_never_follow_a_redirect_to_another_host():
    """A 307 to another host keeps the POST but drops the Authorization header (curl's rule since CVE-2018-1000007)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from dflashctl.sentinel.deliver import post

    with Receiver("ok") as final:
        class Redirect(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(307)
                self.send_header("Location", f"http://localhost:{final.port}/moved")  # another host name
                self.end_headers()

            def log_message(self, *_a: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            assert post(f"http://alice:{PASSWORD}@127.0.0.1:{server.server_address[1]}/hook", b"{}",
                        {"Content-Type": "application/json"}, 10.0) == 200
        finally:
            server.shutdown()
            server.server_close()
        (req,) = final.requests
    assert req.path == "/moved" and "Authorization" not in req.headers
