"""Install the agent archive where the bootstrap looks for it (stdlib only; any Python 3; sent as `PYTHON -c <this>
FOLDER SHA256` with the archive's bytes on stdin, only when the bootstrap found none).

What arrived must hash to SHA256 (the archive's name), else nothing is written. The folder must be a real directory
(not a symlink) owned by us and writable by nobody else, and every folder above it root's or ours and writable by
nobody else unless sticky: the bootstrap runs whatever sits there. The archive is
re-packed with every module compiled by THIS interpreter beside its source (`mod.pyc` next to `mod.py`, the names
zipimport looks for; unchecked-hash pycs, so no timestamp is compared): a call then loads code instead of compiling
~1 MB of source each time. Another Python finds the magic number wrong and falls back to the source. The re-packed
file ends in a zip comment `dflash-agent <sha256 of everything before it>`, which the bootstrap checks, so a partial
or altered file is installed again rather than run. Written to a temporary name, then renamed: racing installs and
calls never see half a file. One line on stdout says what happened: `DFLASH-AGENT-INSTALL ok|refused: why`.

`PYTHON -c <this> --private SHA256 VERB [ARGS]` installs nowhere lasting: where FOLDER is refused (`hosts check` on a
host whose workspace is a file or not writable must still run every check and name the workspace in its own row), the
archive goes to a fresh private temporary folder (mkdtemp: 0700, ours), VERB (an argv verb: stdin held the archive)
runs from there in this process, and the folder is removed after it.
"""

import contextlib
import hashlib
import os
import shutil
import stat
import sys
import time

TAG = b"dflash-agent "  # the trailer the bootstrap checks (remote/agentpack.py BOOT)
REFUSED = 3
KEEP = 3  # archives kept beside the new one: each CLI version leaves ~1 MB; an older CLI still in use reinstalls


def say(line: str) -> None:
    sys.stdout.write("DFLASH-AGENT-INSTALL " + line + "\n")
    sys.stdout.flush()


def folder_problem(folder: str):  # -> str | None
    """Why the bootstrap must not run code from folder (None: it is ours alone)."""
    try:
        st = os.lstat(folder)
    except OSError as e:
        return f"cannot read {folder}: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        return f"{folder} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a directory"
    if st.st_uid != os.getuid():
        return f"{folder} is owned by uid {st.st_uid}, not by us (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return parents_problem(folder)


def parents_problem(folder: str):  # -> str | None
    """Why a folder above folder lets someone else swap the archive between the bootstrap's check and zipimport's
    re-opening of it (None: none does). sshd's StrictModes rule: each folder of its real path up to / belongs to root
    or us and is writable by nobody else unless sticky. remote/agentcall.py BOOT applies the same rule (a test holds
    the two in step: BOOT is text in argv and cannot import this)."""
    path = os.path.realpath(folder)
    while path != "/":
        path = os.path.dirname(path)
        try:
            st = os.stat(path)
        except OSError as e:
            return f"cannot read {path}: {e.strerror or e}"
        if st.st_uid not in (0, os.getuid()):
            return f"{path}, above {folder}, is owned by uid {st.st_uid}, not by us (uid {os.getuid()}) or root"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{path}, above {folder}, is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def trailer_holds(data: bytes) -> bool:
    """Whether data ends in the trailer with_bytecode writes (BOOT's check; the launcher's on a run's copy)."""
    return data[-77:-64] == TAG and hashlib.sha256(data[:-77]).hexdigest().encode() == data[-64:]


def with_bytecode(data: bytes, where: str) -> bytes:
    """The archive again, each module's `.pyc` (this interpreter's) beside its `.py`; a module this Python cannot
    compile keeps only its source (an old interpreter still reaches `check`). Its imports are here: the laptop imports
    this module for TAG on every command."""
    import importlib.util
    import io
    import marshal
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            src = zin.read(info)
            zout.writestr(info, src)
            if not info.filename.endswith(".py") or not hasattr(importlib.util, "source_hash"):  # < 3.7: no pycs
                continue
            try:
                code = compile(src, os.path.join(where, info.filename), "exec", dont_inherit=True)
            except (SyntaxError, ValueError):
                continue
            pyc = importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + importlib.util.source_hash(src) + \
                marshal.dumps(code)
            zinfo = zipfile.ZipInfo(info.filename[:-3] + ".pyc", info.date_time)
            zinfo.compress_type, zinfo.external_attr = zipfile.ZIP_DEFLATED, info.external_attr
            zout.writestr(zinfo, pyc)
    body = out.getvalue()
    body = body[:-2] + (len(TAG) + 64).to_bytes(2, "little")  # the end record's comment length, then the comment
    return body + TAG + hashlib.sha256(body).hexdigest().encode()


def install(folder: str, sha: str, data: bytes) -> int:
    if hashlib.sha256(data).hexdigest() != sha:
        say(f"refused: the archive arrived damaged ({len(data)} bytes, another sha256)")
        return REFUSED
    try:
        os.makedirs(folder, 0o700, exist_ok=True)
    except OSError as e:
        say(f"refused: cannot make {folder}: {e.strerror or e}")
        return REFUSED
    why = folder_problem(folder)
    if why:
        say("refused: " + why)
        return REFUSED
    path = os.path.join(folder, sha + ".pyz")
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        packed = with_bytecode(data, path)
        with open(tmp, "wb") as f:
            f.write(packed)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except Exception as e:  # noqa: BLE001 - whatever failed (a full disk, a bad zip): one line, no half file
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        say(f"refused: cannot write {path}: {getattr(e, 'strerror', None) or e}")
        return REFUSED
    prune(folder, path)
    say("ok " + path)
    return 0


def prune(folder: str, keep_path: str) -> None:
    """Remove all but the KEEP newest other archives, and temporary files an interrupted install left (an hour old:
    a younger one may be a racing install's). A run never needs these: it runs from its own copy (`<run>/agent.pyz`)."""
    archives = []
    for name in os.listdir(folder):
        full = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            st = os.lstat(full)
            if full == keep_path or not stat.S_ISREG(st.st_mode):
                continue
            if ".pyz.tmp-" in name and st.st_mtime < time.time() - 3600:
                os.unlink(full)
            elif name.endswith(".pyz"):
                archives.append((st.st_mtime, full))
    for _, full in sorted(archives, reverse=True)[KEEP:]:
        with contextlib.suppress(OSError):
            os.unlink(full)


def run_private(sha: str, data: bytes, argv: list) -> int:
    """Run argv's verb from a temporary install that only this call sees, removed after it."""
    import tempfile

    if hashlib.sha256(data).hexdigest() != sha:
        say(f"refused: the archive arrived damaged ({len(data)} bytes, another sha256)")
        return REFUSED
    try:
        folder = tempfile.mkdtemp(prefix="dflash-agent-")
    except OSError as e:
        say(f"refused: cannot make a temporary folder: {e.strerror or e}")
        return REFUSED
    try:
        path = os.path.join(folder, sha + ".pyz")
        try:
            with open(path, "wb") as f:
                f.write(with_bytecode(data, path))
        except Exception as e:  # noqa: BLE001 - a full /tmp, a bad zip: one line
            say(f"refused: cannot write {path}: {getattr(e, 'strerror', None) or e}")
            return REFUSED
        sys.path.insert(0, path)
        from dflashctl.agent.verbs import main

        return main(argv, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "--private":
        sys.exit(run_private(sys.argv[2], sys.stdin.buffer.read(), sys.argv[3:]))
    sys.exit(install(os.path.expanduser(sys.argv[1]), sys.argv[2], sys.stdin.buffer.read()))
