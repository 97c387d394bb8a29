"""The compile cache's folder (issue 73 item 4, mtpx/engine/compile_cache.py): an unusable
$MTPX_CACHE_DIR (a file, no free space, a file-size limit) is one warning line naming the folder
and the variable, and the run compiles without saving; a graph another process is building is
waited for and loaded, not compiled again; the C kernels' build names a full disk; a write past
the file-size limit is one line naming the file (mtpx.io); a saved graph read back is "loading",
not "building"."""
import io
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from mtpx.engine import compile_cache
from mtpx.engine.compile_progress import CompileProgress
from mtpx.engine.precompile import Precompiled
from mtpx.io import cache_dir_problem

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state without warnings given, Inductor's cache restored after the test."""
    monkeypatch.setattr(compile_cache, "_warned", set())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def test_cache_dir_problems_are_named(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    assert cache_dir_problem(tmp_path / "file", 1) == "a file, not a folder"
    assert cache_dir_problem(tmp_path / "new" / "dir", 1) is None and (tmp_path / "new" / "dir").is_dir()
    import shutil
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(2**30, 2**30 - 2**20, 2**20))
    assert cache_dir_problem(tmp_path, 64 * 2**20) == "1 MB free, under the 64 MB it needs"


def test_an_unusable_cache_is_one_warning_and_inductor_moves(tmp_path, monkeypatch, capsys, fresh):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path / "file"))
    assert compile_cache.usable_cache() is False
    assert compile_cache.usable_cache() is False
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: the cache folder {tmp_path / 'file'} cannot be used (a file, not a folder): "
                   "compiled graphs are not saved (a later run compiles them again); point MTPX_CACHE_DIR "
                   "at a writable folder with free space"]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(os.path.join(os.path.realpath("/tmp"), "mtpx-"))
    assert compile_cache.saving_off()
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path / "ok"))
    monkeypatch.setattr(compile_cache, "_warned", set())
    assert compile_cache.usable_cache() is True and capsys.readouterr().err == ""


def _add(x, y):
    return x * 2 + y


def _precompiled(folder: Path) -> Precompiled:
    import contextlib
    return Precompiled(_add, folder, "aot_eager", {}, contextlib.nullcontext, lambda: [], lambda: None)


def test_a_graph_another_process_builds_is_waited_for_and_loaded(tmp_path, fresh, capsys):
    """The lock (filelock on <folder>/<graph>.lock) is held by 'another process' (this test);
    the engine waits with one line, then loads the graph that process saved and compiles none."""
    from filelock import FileLock
    x, y = torch.arange(4.0), torch.ones(4)
    torch._dynamo.reset()
    builder = CompileProgress(1, enabled=False)
    assert torch.equal(_precompiled(tmp_path / "a").call("add", (x, y), lambda: None, builder), x * 2 + y)
    assert [r["source"] for r in builder.records] == ["compiled"]
    folder = tmp_path / "b"
    folder.mkdir()
    lock = FileLock(str(folder / "add.lock"))
    lock.acquire()
    waiter, out = CompileProgress(1, enabled=False), []
    t = threading.Thread(target=lambda: out.append(_precompiled(folder).call("add", (x, y), lambda: None,
                                                                               waiter)))
    torch._dynamo.reset()
    t.start()
    deadline = time.monotonic() + 60
    while "another process is building add" not in capsys.readouterr().err:
        assert time.monotonic() < deadline and t.is_alive()
        time.sleep(0.05)
    for f in (tmp_path / "a").glob("add.*.bin"):        # "the other process" saves its graph, then unlocks
        (folder / f.name).write_bytes(f.read_bytes())
    lock.release()
    t.join(60)
    assert not t.is_alive() and torch.equal(out[0], x * 2 + y)
    assert [r["source"] for r in waiter.records] == ["loaded"]


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=240, cwd=ROOT, env=env)


def test_a_graph_that_cannot_be_saved_past_the_file_size_limit_runs_with_one_warning(tmp_path):
    """RLIMIT_FSIZE (ulimit -f) of 4 KB: saving the graph fails with EFBIG; the call still returns
    the right tensor, through torch.compile, and stderr has one warning naming the folder and
    MTPX_CACHE_DIR, no traceback."""
    r = _run(f"""
        import os, resource, torch
        os.environ["MTPX_CACHE_DIR"] = {str(tmp_path)!r}
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = {str(tmp_path / "inductor")!r}
        from tests.test_compile_cache import _precompiled
        from mtpx.engine.compile_progress import CompileProgress
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        x, y = torch.arange(4.0), torch.ones(4)
        p = _precompiled({str(tmp_path / "precompiled")!r})
        for _ in range(2):
            out = p.call("add", (x, y), lambda: None, CompileProgress(1, enabled=False))
            assert torch.equal(out, x * 2 + y)
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "warning" in ln.lower() or "Traceback" in ln]
    assert lines == [f"warning: the cache folder {tmp_path} cannot be used (File too large writing "
                     f"{tmp_path / 'precompiled'}): compiled graphs are not saved (a later run compiles them "
                     "again); point MTPX_CACHE_DIR at a writable folder with free space"], r.stderr[-2000:]


def test_atomic_write_past_the_file_size_limit_is_one_line_naming_the_file(tmp_path):
    r = _run(f"""
        import resource
        from mtpx.io import atomic_write_bytes, disk_error_line
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
        try:
            atomic_write_bytes({str(tmp_path / "big.bin")!r}, b"x" * 5000)
        except OSError as e:
            print(disk_error_line(e))
    """)
    assert r.stdout == (f"File too large ({tmp_path / 'big.bin'}): raise the file-size limit (ulimit -f) or "
                        "write less\n"), r.stderr
    assert list(tmp_path.iterdir()) == []           # no temporary file left


def test_a_saved_graph_read_back_is_loading_not_building():
    out = io.StringIO()
    progress = CompileProgress(2, stream=out, live=False)
    with progress.build("verify (1-token window)", "loaded"):
        pass
    with progress.build("draft", "compiled"):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "engine.compile: loading verify (1-token window) (graph 1 of 2) ..."
    assert lines[2] == "engine.compile: building draft (graph 2 of 2) ..."


def test_the_kernel_build_names_a_full_disk(tmp_path, monkeypatch, capsys):
    """A cache folder without free space: the kernels are built in a temporary folder (one line
    naming the folder and MTPX_CACHE_DIR); a build that fails there for want of space says so."""
    from mtpx.kernels import build
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path))
    calls = []

    def problem(path, need):
        calls.append(Path(path))
        return "0 MB free, under the 16 MB it needs"
    monkeypatch.setattr(build, "cache_dir_problem", problem)

    def compile_(cc, flags, tmp):
        raise RuntimeError(f"{cc} failed: {tmp}/gdn_decode.o: No such file or directory")
    monkeypatch.setattr(build, "_compile", compile_)
    with pytest.raises(RuntimeError, match=r"building in /tmp/mtpx-kernels-\w+ failed: 0 MB free, under"):
        build._build()
    assert capsys.readouterr().err.startswith(
        f"warning: the cache folder {tmp_path / 'kernels'} cannot be used (0 MB free, under the 16 MB it "
        "needs): the CPU kernels are built in a temporary folder")
