"""The Python standard library as a code source: this interpreter's stdlib folder and the .py files
that training may read (every file but test suites, installed packages and the evaluation's
held-out modules, ``mtpx.data.prompts.STDLIB_HELDOUT_MODULES``)."""
from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

__all__ = ["stdlib_dir", "stdlib_files"]

# stdlib folders that are not "the library": test suites (huge, repetitive), installed third-party
# packages, caches
_STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_dir() -> Path:
    """Folder of this interpreter's pure-Python standard library (e.g. .../lib/python3.11)."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(max_bytes: int | None = None, root: str | os.PathLike | None = None) -> list[Path]:
    """The stdlib .py files used for training, in a deterministic order.

    Test suites, site-packages and the eval set's held-out files
    (`mtpx.data.prompts.STDLIB_HELDOUT_MODULES`, paths relative to the stdlib folder) are excluded.
    Files are ordered by the MD5 of their relative path (a fixed pseudo-random order, so a size
    budget takes a spread of modules rather than the alphabetical head), and taken while the total
    stays within `max_bytes` (None: all, ~12 MB on CPython 3.11).

    Raises:
        FileNotFoundError: the stdlib folder does not exist.
    """
    from mtpx.data.prompts import STDLIB_HELDOUT_MODULES

    root = Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib folder {root} not found: this Python has no source stdlib; "
                                "drop 'stdlib' from train.data_sources")
    heldout = {Path(m).as_posix() for m in STDLIB_HELDOUT_MODULES}
    rels = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP_DIRS]  # prune: never walk test/
        base = Path(dirpath).relative_to(root)
        for name in filenames:
            rel = (base / name).as_posix()
            if name.endswith(".py") and rel not in heldout:
                rels.append(rel)
    rels.sort(key=lambda r: (hashlib.md5(r.encode()).hexdigest(), r))
    out, total = [], 0
    for rel in rels:
        size = (root / rel).stat().st_size
        if max_bytes is not None and total + size > max_bytes:
            continue  # a smaller file later in the order may still fit
        out.append(root / rel)
        total += size
    return out
