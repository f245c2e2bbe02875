import json, shutil
from pathlib import Path
from lifecycle.conftest import _no_run_outlives_its_test  # noqa: F401
from .conftest import cue, launch_prog, of_kind, events, sentinel_pid, wait_until, write_prog
from .receiver import Receiver

def test_debug(local_host, cli, tmp_path):
    src = write_prog(tmp_path / "p")
    with Receiver("ok") as good:
        doc = launch_prog(cli, src, "--name", "storm", "--notify", good.url("/x"), doomed=16)
        rd = Path(doc["run_dir"])
        sentinel_pid(rd)
        wait_until(lambda: of_kind(rd, "first-step"), timeout=60)
        cue(rd, "crash")
        good.wait_for(lambda ms: [m for m in ms if m["kind"] == "worker-crashed"], timeout=90)
        try:
            wait_until(lambda: len(of_kind(rd, "worker-crashed")) >= 16, timeout=20, what="16")
        except AssertionError:
            pass
        cli("stop", doc["run_id"])
        good.wait_for(lambda ms: [m for m in ms if m["kind"] == "ended"], timeout=60)
        out = Path("/tmp/stormdbg"); shutil.rmtree(out, ignore_errors=True); shutil.copytree(rd, out, ignore=shutil.ignore_patterns("*.pyz"))
        (out / "msgs.json").write_text(json.dumps(good.messages(), indent=1))
