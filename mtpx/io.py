"""Atomic file writes: a reader sees either the old file or the complete new one, never half.

Every writer here serializes its whole payload in memory first, then writes it to a temporary
file in the destination's directory (same file system, so the rename is atomic), flushes and
fsyncs it, and moves it over the destination with ``os.replace``. If serialization or the write
fails, the destination is left untouched and the temporary file is removed.

Parent directories are created when missing. New files get the usual permissions (0o666 minus
the process umask), not the 0o600 of ``tempfile``.

`GracefulInterrupt` turns Ctrl-C or SIGTERM (timeout, docker, SLURM, Kubernetes) into a stop at the
next safe point, `sigterm_as_ctrl_c` makes SIGTERM raise KeyboardInterrupt as Ctrl-C does outside
those points, and `Interrupted` is how a run that kept what finished says so (the entry point
exits `stop_exit_code()`, 130 after Ctrl-C, 143 after SIGTERM, with its one line).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "atomic_write_jsonl",
           "atomic_write_folder", "check_writable_dir", "disk_error_line", "DISK_ERRNOS", "cache_dir_problem",
           "cache_dir_line"]

# errors of the file system, not of the program: a one-line message names the path and the fix
DISK_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EROFS, errno.EACCES,
                                    errno.EPERM, errno.EFBIG) if e is not None)


def _as_disk_error(e: BaseException) -> OSError | None:
    """`e` as an OSError with its errno when it is one or wraps one: safetensors' SafetensorError
    (a Rust io::Error, 'No space left on device (os error 28)') is not an OSError."""
    if isinstance(e, OSError):
        return e
    text = str(e)
    if type(e).__name__ == "SafetensorError":
        for code, marks in ((errno.ENOSPC, ("os error 28", "No space left", "StorageFull")),
                            (errno.EDQUOT, ("os error 122", "Disk quota exceeded")),
                            (errno.EROFS, ("os error 30", "Read-only file system")),
                            (errno.EACCES, ("os error 13", "Permission denied"))):
            if any(m in text for m in marks):
                return OSError(code, os.strerror(code))
    return None


def disk_error_line(e: BaseException) -> str | None:
    """One line for a file-system error (DISK_ERRNOS: full disk, quota, read-only, permission):
    what failed on which path and the fix; None for any other error."""
    err = _as_disk_error(e)
    if err is None or err.errno not in DISK_ERRNOS:
        return None
    if err.strerror and err.strerror != os.strerror(err.errno):
        return err.strerror                  # already one line with its fix (atomic_write_folder)
    where = f" ({err.filename})" if err.filename else ""
    fix = ("free disk space or point the output elsewhere"
           if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))
           else "raise the file-size limit (ulimit -f) or write less"
           if err.errno == errno.EFBIG else "point the output at a folder you can write")
    return f"{err.strerror}{where}: {fix}"


def check_writable_dir(path: str | os.PathLike[str], key: str, create: bool = True,
                       shown: str | None = None) -> Path:
    """Folder `path` (config key `key`, its value `shown` in the message, default `path`) created
    if `create` and probed with a temporary file (without create: probed in its nearest existing
    ancestor, nothing is created). Raises
    ValueError naming `key` and the fix when it cannot be created or written (read-only, under
    /proc, a file in the way, no permission)."""
    path = Path(path)
    probe_dir = path
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        else:
            probe_dir = next(p for p in (path, *path.parents) if p.exists())
            if not probe_dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe_dir))
        import tempfile
        fd, probe = tempfile.mkstemp(dir=probe_dir, prefix=".mtpx-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or str(e)
        where = (f" in {probe_dir}" if e.filename and ".mtpx-write-test-" in str(e.filename)
                 else f": {e.filename}" if e.filename and str(e.filename) != str(path) else "")
        raise ValueError(f"{key}={shown or path} cannot be created or written ({reason}{where}): "
                         f"point {key} at a folder you can write") from None
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Atomically replace the file at ``path`` with ``data``.

    Args:
        path: destination file; its parent directories are created if needed.
        data: the complete new content.

    Returns:
        The destination as a ``Path``.

    Raises:
        OSError: the directory cannot be created or written; the destination is unchanged.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS and e.filename is None:
            raise OSError(e.errno, e.strerror, str(dest)) from None     # name the file (disk_error_line)
        raise
    _fsync_dir(dest.parent)
    return dest


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Atomically replace the file at ``path`` with ``text`` encoded as ``encoding``.

    Raises:
        UnicodeEncodeError: ``text`` cannot be encoded; the destination is unchanged.
        OSError: as :func:`atomic_write_bytes`.
    """
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = 2) -> Path:
    """Atomically write ``obj`` as one strict JSON document (NaN/inf are rejected), newline-ended.

    Raises:
        TypeError: ``obj`` holds a value JSON cannot represent; the destination is unchanged.
        ValueError: ``obj`` holds NaN or infinity; the destination is unchanged.
    """
    text = _dumps(obj, path, indent=indent) + "\n"
    return atomic_write_text(path, text)


def atomic_write_jsonl(path: str | os.PathLike[str], rows: Iterable[Any]) -> Path:
    """Atomically write ``rows`` as JSON Lines: one compact strict-JSON value per line.

    Raises:
        TypeError, ValueError: a row cannot be serialized (the message names the row index);
            the destination is unchanged.
    """
    lines = [_dumps(row, path, indent=None, row=i) + "\n" for i, row in enumerate(rows)]
    return atomic_write_text(path, "".join(lines))


def atomic_write_folder(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Replace the folder at ``path`` with the one ``write(tmp)`` fills, all or nothing.

    ``write`` fills a hidden sibling folder ``.{name}.tmp-XXXX``. Only when it returns is the
    previous folder moved aside (``.{name}.old-XXXX``), the new one renamed into place and the old
    one deleted, so a crash leaves the previous folder or the new one under the final name (or,
    between the two renames, the previous one under ``.old``).

    Raises:
        anything ``write`` raises: the temporary folder is removed and ``path`` is untouched.
        OSError: the parent cannot be created or written; ENOSPC / EDQUOT (also from a
            SafetensorError, which is not an OSError) with a one-line message naming ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        write(tmp)
        mode = 0o666 & ~_umask()
        for f in tmp.rglob("*"):   # safetensors writes 0600 files; give them the usual permissions
            if f.is_file():
                f.chmod(mode)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        err = None if isinstance(e, (KeyboardInterrupt, SystemExit)) else _as_disk_error(e)
        if err is not None and err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            raise OSError(err.errno, f"no space left to write {path} (a save writes the new folder beside "
                                     "the old one, so it needs the checkpoint's size free again; the "
                                     "previous one is kept): "
                                     "free disk space or point the output elsewhere") from None
        raise
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{secrets.token_hex(4)}")
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def recover_folder(path: str | os.PathLike[str]) -> list[str]:
    """Repair what an interrupted atomic_write_folder(path) left: the previous folder under
    ``.{name}.old-XXXX`` with nothing at ``path`` (a crash between the two renames) is renamed back,
    and leftover ``.{name}.tmp-XXXX`` folders (a save cut short) are removed. Returns one line per
    repair, for the caller to print."""
    path = Path(path)
    notes = []
    if not path.parent.is_dir():
        return notes
    for tmp in sorted(path.parent.glob(f".{path.name}.tmp-*")):
        shutil.rmtree(tmp, ignore_errors=True)
        notes.append(f"removed {tmp.name}, the leftover of an interrupted save")
    backups = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda b: b.stat().st_mtime)
    if backups and not path.exists():
        os.replace(backups[-1], path)
        notes.append(f"restored {path} from {backups[-1].name} (a save was interrupted between its renames)")
        backups = backups[:-1]
    for b in backups:       # a complete folder is in place: older copies are the swap's leftovers
        shutil.rmtree(b, ignore_errors=True)
    return notes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _dumps(obj: Any, path: str | os.PathLike[str], indent: int | None, row: int | None = None) -> str:
    """``json.dumps`` with ``allow_nan=False``; errors name the destination (and row)."""
    where = f"{path}" if row is None else f"{path} (row {row})"
    try:
        return json.dumps(obj, indent=indent, allow_nan=False, ensure_ascii=False)
    except TypeError as err:
        raise TypeError(
            f"{where}: cannot serialize to JSON ({err}); convert the value to a str, number, "
            "bool, None, list or dict first"
        ) from err
    except ValueError as err:
        raise ValueError(
            f"{where}: cannot serialize to JSON ({err}); replace NaN/inf with None first"
        ) from err


def _fsync_dir(directory: Path) -> None:
    """Best-effort fsync of ``directory`` so the rename itself survives a crash (POSIX only)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Interrupted(Exception):
    """A run stopped by Ctrl-C or SIGTERM after writing what had finished; str(e) says what was kept."""


_received: list[int] = []     # stop signals received since sigterm_as_ctrl_c was entered, in order


def stop_signal_name() -> str:
    """The first stop signal received: "SIGTERM", or "SIGINT" (also when none was recorded: a
    KeyboardInterrupt from Python's own Ctrl-C handler)."""
    import signal
    return "SIGTERM" if _received and _received[0] == signal.SIGTERM else "SIGINT"


def stop_exit_code() -> int:
    """128 + the first stop signal's number, as a shell reports a process it killed: 130
    (SIGINT), 143 (SIGTERM)."""
    import signal
    return 128 + int(getattr(signal, stop_signal_name()))


def _install(handler) -> dict:
    """handler for SIGINT and SIGTERM -> the previous handlers ({} outside the main thread, where
    signal handlers cannot be installed)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def _restore(previous: dict) -> None:
    import signal
    for s, h in previous.items():
        signal.signal(s, h)


class sigterm_as_ctrl_c:
    """Inside the `with` block SIGTERM raises KeyboardInterrupt, as Ctrl-C does (and both are
    recorded for stop_exit_code); the block starts with no signal recorded."""

    def __enter__(self) -> "sigterm_as_ctrl_c":
        _received.clear()
        self._previous = _install(self._handle)
        return self

    @staticmethod
    def _handle(signum, frame) -> None:
        _received.append(signum)
        raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        _restore(self._previous)


class GracefulInterrupt:
    """Ctrl-C or SIGTERM as a request to stop at the next safe point: inside the `with` block the
    first SIGINT or SIGTERM only sets `requested` (the loop checks it between steps, keeps what
    finished and stops); a second one raises KeyboardInterrupt at once. Outside the main thread
    (where signal handlers cannot be installed) it does nothing and the signals behave as usual."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        _received.append(signum)
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "GracefulInterrupt":
        self._previous = _install(self._handle)
        return self

    def __exit__(self, *exc) -> None:
        _restore(self._previous)
        self._previous = {}


@functools.lru_cache(maxsize=1)
def source_commit() -> str | None:
    """The git commit of the mtpx source tree that ran ("+dirty" with uncommitted changes), or None
    outside a git checkout (read once per process)."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def cache_dir_problem(path: str | os.PathLike[str], need_bytes: int) -> str | None:
    """Why folder `path` cannot take `need_bytes` more (a file in the way, not writable, less free
    space), as a phrase; None when it can. The folder is created if missing; nothing else is left."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return "a file, not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = __import__("tempfile").mkstemp(dir=path, prefix=".mtpx-write-test-")
        os.close(fd)
        os.unlink(probe)
        free = shutil.disk_usage(path).free
    except OSError as e:
        return e.strerror or str(e)
    if free < need_bytes:
        return f"{free / 2**20:.0f} MB free, under the {need_bytes / 2**20:.0f} MB it needs"
    return None


def cache_dir_line(path: str | os.PathLike[str], problem: str, what: str) -> str:
    """The one warning line of an unusable cache folder `path` (under mtpx_cache_dir): the
    problem, what is not saved, the variable and the fix."""
    var = "MTPX_CACHE_DIR" if os.environ.get("MTPX_CACHE_DIR") else "MTPX_CACHE_DIR (unset)"
    return (f"warning: the cache folder {path} cannot be used ({problem}): {what}; point {var} at a "
            "writable folder with free space")


def mtpx_cache_dir() -> Path:
    """$MTPX_CACHE_DIR, else $XDG_CACHE_HOME/mtpx, else ~/.cache/mtpx (vLLM's VLLM_CACHE_ROOT): where
    compiled graphs, step costs and built CPU kernels are kept between runs."""
    root = os.environ.get("MTPX_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mtpx"


def utc_now() -> str:
    """The current time in UTC, ISO 8601 to the second ("2026-12-03T16:40:05Z"): run dates in
    metrics.json and figure titles."""
    import datetime
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
