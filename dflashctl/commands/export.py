"""export: a run's drafter in the layout the DFlash ecosystem loads, written in the container and copied here.

The container runs `python -m trainer.export --into <run>/exports` on the run's newest checkpoint (the directory
is kept when an earlier export of the same checkpoint and dtype wrote it), prints the files' sizes and sha256; the
two files come back as one tar stream through the same ssh / `pct exec` channel as every other command, are
unpacked beside `out`, checked against those digests and only then renamed to `out`. `out` must not exist: a
local directory is never overwritten, and an interrupted copy leaves nothing under that name.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashctl.commands.runs import get_run, list_runs
from dflashctl.errors import ConfigError, DflashError, ExitCode, NotFound
from dflashctl.remote.target import Target

FILES = ("config.json", "model.safetensors")
EXPORT_TIMEOUT_S = 900  # loading an 8B target's drafter checkpoint (optimizer state included) and hashing it


@dataclass(frozen=True)
class ExportResult:
    host: str
    run_id: str
    remote_dir: str
    local_dir: str
    reused: bool  # the container kept an earlier export of the same checkpoint
    files: dict[str, dict[str, Any]]

    def to_record(self) -> dict[str, Any]:
        return {"host": self.host, "run_id": self.run_id, "remote_dir": self.remote_dir, "local_dir": self.local_dir,
                "reused": self.reused, "files": self.files}


class _Chunks(io.RawIOBase):
    """A readable file over an iterator of byte chunks (tarfile's stream mode reads from it)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buf), len(self._rest))
        buf[:n], self._rest = self._rest[:n], self._rest[n:]
        return n


def export(target: Target, run: str, out: Path | None, dtype: str = "bfloat16") -> ExportResult:
    host = target.host
    if out is not None and out.exists():
        raise ConfigError(f"{out}: already exists (an export never overwrites)", hint="pick a new --out")
    if run == "latest":
        training = [r for r in list_runs(target).runs if r.kind == "train"]
        if not training:
            raise NotFound(f"no training run on {host.name} to export", hint="list runs with `dflashctl runs`")
        run = training[0].id
    info, _ = get_run(target, run)
    if info.kind != "train":
        raise ConfigError(f"run {info.id} is not a training run (kind {info.kind})",
                          hint="name the training run (see `dflashctl runs`)")
    code = f"{host.workspace.rstrip('/')}/code"
    res = target.run(["env", f"PYTHONPATH={code}", host.python, "-m", "trainer.export", "--checkpoint", info.dir,
                      "--into", f"{info.dir}/exports", "--dtype", dtype, "--json"], timeout=EXPORT_TIMEOUT_S)
    if not res.ok:
        why = res.err.strip().splitlines()[-1] if res.err.strip() else f"exit {res.exit_code}"
        raise DflashError(f"export of run {info.id} failed on {host.name}: {why.removeprefix('export: error: ')}",
                          exit_code=ExitCode.USAGE if res.exit_code == 2 else ExitCode.CRASHED,
                          hint="is the code deployed (dflashctl deploy)? did the run save a checkpoint?")
    try:
        doc = json.loads(res.out.strip().splitlines()[-1])
        remote, files = str(doc["out"]), dict(doc["files"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise DflashError(f"export of run {info.id}: unreadable reply from trainer.export ({res.out[:120]!r})",
                          exit_code=ExitCode.CRASHED) from None
    local = out if out is not None else Path("drafters") / f"{info.id}-{Path(remote).name}"
    if local.exists():
        raise ConfigError(f"{local}: already exists (an export never overwrites)", hint="pass --out DIR")
    fetch(target, remote, local, files)
    return ExportResult(host.name, info.id, remote, str(local), bool(doc.get("reused")), files)


def fetch(target: Target, remote: str, local: Path, files: dict[str, dict[str, Any]]) -> None:
    """Copy `remote`'s FILES to `local` (tar over the command channel), each checked against its sha256."""
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.part-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        stream = target.stream(["tar", "-C", remote, "-cf", "-", *FILES])
        with tarfile.open(fileobj=io.BufferedReader(_Chunks(stream), 1 << 20), mode="r|") as tar:
            for member in tar:
                if member.name not in FILES or not member.isfile():
                    raise DflashError(f"refusing tar member {member.name!r} from {remote}",
                                      exit_code=ExitCode.CRASHED)
                src = tar.extractfile(member)
                assert src is not None
                with open(tmp / member.name, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        for name in FILES:
            _check(tmp / name, files.get(name) or {}, remote)
        os.replace(tmp, local)
    except tarfile.TarError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DflashError(f"copy of {remote} broke off ({e})", exit_code=ExitCode.CRASHED,
                          hint="run the same command again: the container keeps the export") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check(path: Path, want: dict[str, Any], remote: str) -> None:
    if not path.is_file():
        raise DflashError(f"copy of {remote}: {path.name} did not arrive", exit_code=ExitCode.CRASHED,
                          hint="run the same command again: the container keeps the export")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != want.get("sha256"):
        raise DflashError(f"copy of {remote}: {path.name} arrived with another sha256 than the container's",
                          exit_code=ExitCode.CRASHED, hint="run the same command again")
