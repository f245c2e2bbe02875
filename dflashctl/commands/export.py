"""export: a run's drafter in the layout the DFlash ecosystem loads, written in the container and copied here.

The container runs `python -m trainer.export --into <run>/exports` on the run's newest checkpoint (the directory
is kept when an earlier export of the same checkpoint and dtype wrote it), prints the files' sizes and sha256; the
two files come back as one tar stream through the same ssh / `pct exec` channel as every other command, are
unpacked beside `out`, checked against those digests and only then renamed to `out`. `out` must not exist: a
local directory is never overwritten, and an interrupted copy leaves nothing under that name.

The container is not trusted with a local path (issue 26): the run id and the export's folder name in its replies
pass analysis/safe_names.py before they name anything here, and its reply must have the fields with their types.
The temporary `.NAME.part-PID` folder is removed on every signal a process can catch (SIGTERM, SIGHUP, SIGINT:
agent/lib/interrupts.py); one a SIGKILLed export left is removed by the next export into the same folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashctl.agent.lib.interrupts import raising_on_signals, remove_dead_leftovers
from dflashctl.analysis.safe_names import MalformedReply, safe_name
from dflashctl.commands.runs import get_run, list_runs
from dflashctl.errors import ConfigError, DflashError, ExitCode, NotFound
from dflashctl.remote.target import Target

FILES = ("config.json", "model.safetensors")
EXPORT_TIMEOUT_S = 900  # loading an 8B target's drafter checkpoint (optimizer state included) and hashing it
_PART = re.compile(r"\..+\.part-(?P<pid>[0-9]{1,10})")  # fetch()'s temporary folder: .NAME.part-PID


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
    run_id = safe_name(info.id, "run id", host.name)
    if info.kind != "train":
        raise ConfigError(f"run {run_id} is not a training run (kind {info.kind})",
                          hint="name the training run (see `dflashctl runs`)")
    code = f"{host.workspace.rstrip('/')}/code"
    res = target.run(["env", f"PYTHONPATH={code}", host.python, "-m", "trainer.export", "--checkpoint", info.dir,
                      "--into", f"{info.dir}/exports", "--dtype", dtype, "--json"], timeout=EXPORT_TIMEOUT_S)
    if not res.ok:
        why = res.err.strip().splitlines()[-1] if res.err.strip() else f"exit {res.exit_code}"
        raise DflashError(f"export of run {run_id} failed on {host.name}: {why.removeprefix('export: error: ')}",
                          exit_code=ExitCode.USAGE if res.exit_code == 2 else ExitCode.CRASHED,
                          hint="is the code deployed (dflashctl deploy)? did the run save a checkpoint?")
    remote, files, reused = reply(res.out, host.name, run_id)
    folder = safe_name(Path(remote).name, "export folder name", host.name)
    local = out if out is not None else Path("drafters") / f"{run_id}-{folder}"
    if local.exists():
        raise ConfigError(f"{local}: already exists (an export never overwrites)", hint="pass --out DIR")
    fetch(target, remote, local, files)
    return ExportResult(host.name, run_id, remote, str(local), reused, files)


def reply(text: str, host: str, run_id: str) -> tuple[str, dict[str, dict[str, Any]], bool]:
    """trainer.export's last line: (its folder in the container, {file: {"size", "sha256"}}, reused), every field
    there with its type; else one line naming the host and the field (exit 100)."""
    def bad(why: str) -> MalformedReply:
        return MalformedReply(f"export of run {run_id}: host {host} sent a malformed reply from trainer.export "
                              f"({why}): {text.strip()[-120:]!r}", hint="is the deployed code current? "
                              "(dflashctl deploy)")
    try:
        doc = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise bad("not JSON") from None
    if not isinstance(doc, dict):
        raise bad("not an object")
    remote, files = doc.get("out"), doc.get("files")
    if not isinstance(remote, str) or not remote.startswith("/"):
        raise bad("`out` is not an absolute path")
    if not isinstance(files, dict) or sorted(files) != sorted(FILES):
        raise bad(f"`files` does not list {' and '.join(FILES)}")
    for name, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or type(entry.get("size")) is not int:
            raise bad(f"`files.{name}` lacks its size or sha256")
    return remote, files, doc.get("reused") is True


def fetch(target: Target, remote: str, local: Path, files: dict[str, dict[str, Any]]) -> None:
    """Copy `remote`'s FILES to `local` (tar over the command channel), each checked against its sha256."""
    local.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_leftovers(str(local.parent), _PART)  # what a SIGKILLed export left
    tmp = local.with_name(f".{local.name}.part-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with raising_on_signals():
        tmp.mkdir()
        try:
            _copy(target, remote, local, tmp, files)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _copy(target: Target, remote: str, local: Path, tmp: Path, files: dict[str, dict[str, Any]]) -> None:
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
    except tarfile.TarError as e:
        raise DflashError(f"copy of {remote} broke off ({e})", exit_code=ExitCode.CRASHED,
                          hint="run the same command again: the container keeps the export") from None
    try:
        if os.path.lexists(local):
            raise FileExistsError
        os.rename(tmp, local)  # never onto something that appeared meanwhile (an empty dir would be replaced)
    except OSError as e:
        raise ConfigError(f"{local}: appeared while the copy ran (an export never overwrites)"
                          if isinstance(e, FileExistsError) or os.path.lexists(local)
                          else f"{local}: cannot be created ({e.strerror or e})",
                          hint="pick a new --out and run the same command again (the container keeps the export)"
                          ) from None


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
