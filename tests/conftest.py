"""Shared fixtures. The harness (real sshd, pct and nvidia-smi stand-ins) is documented in
tests/harness/README.md; `sshd_server`, `pve` and `local_host` are the public fixtures."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # makes `harness` importable from any test

from harness.envs import LocalEnv, PveEnv  # noqa: E402
from harness.sshd import SshdServer, why_lxc_cannot_run, why_sshd_cannot_run  # noqa: E402

SSHD_FIXTURES = {"sshd_server", "pve"}


HF_SUITE = Path(__file__).resolve().parent / "trainer_hf"


def _hf_required() -> bool:
    """make test installs the Hugging Face stack: there its suite must run, so a skip in it is a failure."""
    return os.environ.get("DFLASHCTL_REQUIRE_HF") == "1"


@functools.cache
def _pct_backend() -> tuple[str, str]:
    """Which `pct` the end-to-end tests get: ("lxc", why) real LXC containers, or ("ns", why) the namespace stand-in.
    DFLASHCTL_REQUIRE_LXC=1 (make test as root) turns "LXC cannot run here" into a failure."""
    if os.environ.get("DFLASHCTL_TEST_PCT") == "ns":  # to run the suite on the fallback on purpose
        return "ns", "the namespace stand-in bin/pct-ns: DFLASHCTL_TEST_PCT=ns"
    reason = why_lxc_cannot_run()
    if reason is None:
        return "lxc", "real LXC containers (lxc-start/lxc-attach, init.lxc as PID 1)"
    return "ns", f"the namespace stand-in bin/pct-ns: {reason}"


def pytest_report_header(config: pytest.Config) -> str:
    backend, why = _pct_backend()
    return f"dflashctl e2e: pct = {why}"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    backend, why = _pct_backend()
    terminalreporter.write_line(f"dflashctl e2e containers: {why}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked `both_env_modes` that use `pve` run twice: `pct exec` keeping the ssh session's environment
    (Proxmox's default) and clearing it (--keep-env 0)."""
    if "pct_env_mode" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_env_modes"):
        metafunc.parametrize("pct_env_mode", ["keep-env", "clear-env"], indirect=True)
    if "pve_connection" in metafunc.fixturenames and metafunc.definition.get_closest_marker("also_persist_0"):
        metafunc.parametrize("pve_connection", ["master", "persist-0"], indirect=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "both_env_modes: run the test's `pve` in both `pct exec` environment modes")
    config.addinivalue_line("markers", "also_persist_0: run the test's `pve` also with `persist = 0` (no master)")
    if _hf_required():
        try:
            import transformers  # noqa: F401
        except ImportError as e:
            raise pytest.UsageError(f"DFLASHCTL_REQUIRE_HF=1 but transformers cannot be imported ({e}): "
                                    "install the extras with `pip install -e '.[hf]'` (make test does)") from e


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _hf_required() and HF_SUITE in Path(item.path).resolve().parents:
        report.outcome = "failed"
        report.longrepr = f"skipped under DFLASHCTL_REQUIRE_HF=1 (the Hugging Face suite must run): {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _hf_required() and HF_SUITE in Path(collector.path).resolve().parents:
        report.outcome = "failed"
        report.longrepr = f"skipped under DFLASHCTL_REQUIRE_HF=1 (the Hugging Face suite must run): {report.longrepr}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use the real sshd carry the `sshd` marker (select with -m sshd); tests marked `slow` start early
    (_slow_early)."""
    for item in items:
        if SSHD_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.sshd)
    items[:] = _slow_early(items)


def _slow_early(items: list[pytest.Item]) -> list[pytest.Item]:
    """The same items with the `slow` ones spread evenly over the first quarter (each group keeps its order).
    xdist's default scheduler deals the first quarter of the collection out at once, one consecutive block per worker,
    and the rest in collection order: a minute-long end-to-end flow collected near the end (tests/status, tests/cluster)
    started last and the run waited on it alone, while all of them at the front would land in one worker's block."""
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if not slow:
        return items
    fast = iter([item for item in items if item.get_closest_marker("slow") is None])
    step = max(len(items) // 4, len(slow)) / len(slow)
    out: list[pytest.Item] = []
    for i, item in enumerate(slow):
        out.extend(itertools.islice(fast, max(0, round(i * step) - len(out))))
        out.append(item)
    out.extend(fast)
    return out


@contextlib.contextmanager
def _masters_dir(mp: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state dir of its own for the ssh connection masters started inside (under a short path: a UNIX socket's
    name has ~107 bytes); every one of them is ended on the way out."""
    import tempfile

    from dflashctl.errors import ConfigError
    from dflashctl.remote.masterclient import end_master, list_masters

    state = Path(tempfile.mkdtemp(prefix="dfm-", dir="/tmp"))
    mp.setenv("DFLASHCTL_STATE_DIR", str(state))
    try:
        yield state / "masters"
    finally:
        try:
            found = list_masters(state / "masters")
        except ConfigError:  # a test made the folder unsafe on purpose: its masters are ended by pid below
            found = []
        for m in found:
            end_master(m)
        _end_strays(state)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def ssh_masters() -> Iterator[Path]:
    """Every master of this test session lives in one directory and ends with the session: none outlives the run."""
    with pytest.MonkeyPatch.context() as mp, _masters_dir(mp) as masters:
        yield masters


@pytest.fixture
def fresh_masters(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state dir of this test's own: the ssh masters it starts are its alone, and end with it."""
    with _masters_dir(monkeypatch) as masters:
        yield masters


def _end_strays(state: Path) -> None:
    """Masters of this session that left no info file (killed mid-start): found by their socket path, by pid."""
    import signal

    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dflashctl.remote.master" in cmdline and any(a.startswith(os.fsencode(str(state))) for a in cmdline):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


@pytest.fixture(autouse=True)
def _no_compile_cache_env_left_by_torch() -> Iterator[None]:
    """torch's inductor writes TORCHINDUCTOR_CACHE_DIR into os.environ the first time it compiles in a process
    (torch/_inductor/runtime/cache_dir_utils.py): a later test of the same worker would launch runs that inherit it
    as if the user had set it, and never use the workspace's cache (docs/usage.md "The compile cache")."""
    names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    for name in names:
        os.environ.pop(name, None)
    yield
    for name in names:
        os.environ.pop(name, None)


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    """A real OpenSSH sshd on 127.0.0.1:<free port>, for the whole session. Skips with the reason
    where it cannot run; with DFLASHCTL_REQUIRE_SSHD=1 (make test, CI) that is a failure instead."""
    reason = why_sshd_cannot_run()
    if reason:
        if os.environ.get("DFLASHCTL_REQUIRE_SSHD") == "1":
            pytest.fail(f"sshd tests cannot run but DFLASHCTL_REQUIRE_SSHD=1: {reason}")
        pytest.skip(f"sshd tests skipped: {reason}")
    backend, why = _pct_backend()
    if backend != "lxc" and os.environ.get("DFLASHCTL_REQUIRE_LXC") == "1":
        pytest.fail(f"real LXC containers cannot run but DFLASHCTL_REQUIRE_LXC=1: {why}")
    server = SshdServer(tmp_path_factory.mktemp("sshd"), pct_backend=backend).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pct_env_mode(request: pytest.FixtureRequest) -> str:
    """`pct exec`'s environment mode for `pve`: "keep-env" (Proxmox's default), or both (marker both_env_modes)."""
    return getattr(request, "param", "keep-env")


@pytest.fixture
def pve_connection(request: pytest.FixtureRequest) -> str:
    """How dflashctl reaches `pve`: "master" (the default a user gets), or also "persist-0" (marker also_persist_0)."""
    return getattr(request, "param", "master")


@pytest.fixture
def pve(sshd_server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        pct_env_mode: str, pve_connection: str) -> Iterator[PveEnv]:
    """A Proxmox-like host over the real sshd with one running container (fresh per test), reached by the
    connection path a user gets by default (the connection master)."""
    env = PveEnv(sshd_server, tmp_path, env_mode=pct_env_mode, persist=pve_connection == "master")
    for key, value in env.env.items():
        monkeypatch.setenv(key, value)
    try:
        yield env
    finally:
        env.close()


@pytest.fixture
def local_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalEnv:
    """The `local` transport with a temp workspace; nvidia-smi absent until set_gpus()."""
    env = LocalEnv(tmp_path)
    for key, value in env.env.items():
        monkeypatch.setenv(key, value)
    return env
