"""The compile cache's folder checked before compiling, a run that keeps going without saving when
it cannot be written, and a lock so that one process builds a graph that others wait for and load.

`usable_cache()` (CompiledDecode, before anything compiles): $MTPX_CACHE_DIR (mtpx.io.mtpx_cache_dir)
must be a writable folder with COMPILE_CACHE_BYTES free. When it is not, one warning line names
the folder, the problem and the variable; graphs are compiled without being saved, and Inductor's
own cache moves to a temporary folder (Inductor cannot compile without writing its code).

`saving_failed(folder, err)` (Precompiled, when writing a graph fails with a full disk, a file-size
limit or a read-only file system): the same, once per process.

`graph_lock(folder, name)`: an exclusive `filelock.FileLock` on `<folder>/<name>.lock` held while
a process compiles and saves a graph; a second process of the same settings waits for it (one line
saying so) and then loads the saved graph instead of compiling it.
"""
from __future__ import annotations

import errno
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from mtpx.io import cache_dir_line, cache_dir_problem, mtpx_cache_dir

COMPILE_CACHE_BYTES = 64 * 2**20
"""Free space a compiled run needs in the cache: the demo's saved graphs take about 7 MB and
Inductor's code 10-30 MB."""

SAVE_ERRNOS = frozenset(e for e in (errno.ENOSPC, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                                    getattr(errno, "EDQUOT", None)) if e is not None)

_warned: set[str] = set()          # folders already named in a warning line (one line per folder)


def _move_inductor_cache() -> str:
    """Point Inductor's cache at a fresh temporary folder (its code must be written somewhere)."""
    from torch._inductor.utils import clear_caches
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="mtpx-inductor-")
    clear_caches()
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def _warn_once(folder: Path, problem: str) -> None:
    if str(folder) not in _warned:
        _warned.add(str(folder))
        print(cache_dir_line(folder, problem, "compiled graphs are not saved (a later run compiles them "
                             "again)"), file=sys.stderr, flush=True)


def usable_cache() -> bool:
    """Whether compiled graphs can be saved under mtpx_cache_dir(); when not, one warning line and
    Inductor's cache moved to a temporary folder (module doc)."""
    root = mtpx_cache_dir()
    problem = cache_dir_problem(root, COMPILE_CACHE_BYTES)
    if problem is None:
        return True
    _warn_once(root, problem)
    _move_inductor_cache()
    return False


def is_save_error(err: BaseException | None) -> OSError | None:
    """The OSError (errno in SAVE_ERRNOS) behind `err` (itself or a cause / context; a compiler's
    "No space left on device" in Inductor's C++ build error), else None."""
    for _ in range(8):
        if err is None:
            return None
        if isinstance(err, OSError) and err.errno in SAVE_ERRNOS:
            return err
        if "No space left on device" in str(err):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        err = err.__cause__ or err.__context__
    return None


def saving_off() -> bool:
    """Whether graphs are no longer saved in this process (saving_failed or usable_cache said so)."""
    return bool(_warned)


def saving_failed(folder: Path, err: OSError) -> None:
    """A graph could not be written under `folder`: one warning line (once), and Inductor's cache
    moved to a temporary folder so that compiling goes on."""
    _warn_once(mtpx_cache_dir(), f"{err.strerror or err} writing {err.filename or folder}")
    _move_inductor_cache()


@contextmanager
def graph_lock(folder: Path, name: str, poll_s: float = 5.0):
    """Hold `<folder>/<name>.lock` while building graph `name` (module doc). Yields True when
    another process held it first (its graph may now be saved: load before compiling). A lock
    that cannot be created (a read-only folder) is skipped."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(folder / f"{name}.lock"))
        lock.acquire(timeout=0)
        waited = False
    except Timeout:
        print(f"engine.compile: another process is building {name} ({folder}); waiting for it to load "
              "its graph", file=sys.stderr, flush=True)
        lock.acquire(poll_interval=min(poll_s, 0.5))
        waited = True
    except OSError:
        yield False
        return
    try:
        yield waited
    finally:
        lock.release()
