"""Whole compiled functions saved and loaded across runs (torch.compile's AOT precompile), so a
second run of the same settings neither traces nor compiles: each graph is one file holding
Dynamo's bytecode, its guards and Inductor's code (`torch.compile(...).aot_compile`,
`torch.compiler.load_compiled_function`). Inductor's caches alone (compile_progress.use_cache_dir)
would still leave Dynamo tracing every graph again.

    fn = Precompiled(verify_forward, folder, options, persistent)
    fn.call("verify (1-token window)", (model, cache, meta), mark, progress)

A graph is found by the name of the call (which carries its static widths) and by its guards: the
files of one name are the variants compiled for it, and the first whose guards pass the arguments
runs. None passing: a new variant is compiled, saved atomically and loaded back, so a run that
compiled calls the same deserialized code as a later run that loads it.

`folder` is keyed by everything the saved code depends on (`precompile_key`): the model's
configuration, dtypes, the cache's geometry, the speculator and k, the compile settings, torch's
version, the thread count and a hash of mtpx's source. Guards on nn.Module identities, globals and
dict versions cannot be serialized and are not kept (the engine never swaps its weights, and its
code is in the key); tensor shapes, strides and dtypes are. Dimension marks (mark_dynamic /
mark_static) are applied only while compiling, because a loaded guard set treats a marked tensor as
a different input. A graph that cannot be saved (a graph break, an unserializable guard) falls back
to plain torch.compile, alone, with one line saying so and a marker file (`<graph>.unsavable`) that
sends later runs there directly. CPU only: CUDA graphs are recorded by the process that runs them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import re
import sys
import types
from pathlib import Path

import torch
import torch._dynamo.package as dynamo_package
from torch._dynamo.guards import CheckFunctionManager

from mtpx.engine.compile_cache import graph_lock, is_save_error, saving_failed, saving_off
from mtpx.io import atomic_write_text

_UNSERIALIZABLE = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
MAX_VARIANTS = 4
"""Saved graphs of one name at most; a name whose inputs keep failing their guards is compiled
by torch.compile for the rest of the run (its dynamic shapes cover them)."""


def _source_hash() -> str:
    """sha256 of mtpx's Python source (the saved bytecode calls into it)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def precompile_key(parts: dict) -> str:
    """A short hash of `parts` (JSON-able) with torch's version, the thread count and mtpx's
    source hash added."""
    full = {**parts, "torch": torch.__version__, "threads": torch.get_num_threads(), "mtpx": _source_hash()}
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:20]


def own_code(fn):
    """fn (a function or bound method) with a code object of its own. Dynamo keeps its compiled
    graphs per code object, so with a copy per engine no engine reuses another's graphs (a graph
    compiled for a MoE model, split at its graph breaks, would otherwise be reused for a dense
    model whose guards it passes) and several engines in one process (a Hydra multirun, the
    lossless check's plain engine, calibration over k) never share Dynamo's recompile limit;
    Precompiled's torch.compile fallbacks get one per graph name."""
    f = getattr(fn, "__func__", fn)
    copy = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__,
                              f.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = f.__kwdefaults__, f.__qualname__
    return types.MethodType(copy, fn.__self__) if hasattr(fn, "__self__") else copy


def guard_filter(entries):
    """torch.compile's guard_filter_fn for saved graphs: no nn.Module guards (as the engine's
    other compiled code), and none of the kinds that cannot be serialized."""
    keep = torch.compiler.skip_guard_on_all_nn_modules_unsafe(entries)
    return [k and not (g.is_global or g.guard_type in _UNSERIALIZABLE
                       or any(t in _UNSERIALIZABLE for t in (g.derived_guard_types or ())))
            for k, g in zip(keep, entries)]


def _tensors(obj, depth: int = 0):
    """The tensors in an argument: a tensor, a list / tuple of arguments, or a dataclass's fields."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, depth + 1)
    elif depth < 3 and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name), depth + 1)


def unmark(tensors) -> None:
    """Remove Dynamo's dimension marks (mark_dynamic, mark_static, ...) from tensors."""
    for t in tensors:
        for attr in [a for a in vars(t) if a.startswith("_dynamo_") or a == "_has_dynamo_dim_marking"]:
            delattr(t, attr)


def _failed_guard(f, args: tuple) -> str:
    """The first guard of a loaded graph `f` that `args` fail, as Dynamo writes it."""
    try:
        info = f._artifacts.guard_manager.check_verbose(f.prepare_f_locals(*args))
        return "; ".join(info.verbose_code_parts)[:300] or "unknown guard"
    except Exception as err:  # noqa: BLE001 - torch internals: the reason is only for the log
        return f"guard not shown: {type(err).__name__}"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


class Precompiled:
    """One function compiled graph by graph into files under `folder` (module doc).

    fn: a module-level function whose inputs are all arguments; options / patches: torch.compile's
    options and the config context managers to trace under (a callable returning one);
    persistent: a callable giving the tensors that are read through the arguments' attributes
    and must be marked static while compiling (marked by mark_persistent)."""

    def __init__(self, fn, folder: Path, backend: str, options: dict, patches, persistent, mark_persistent):
        self.fn, self.folder, self.backend, self.fallback_options = fn, Path(folder), backend, options
        self.options = {**options, "guard_filter_fn": guard_filter}
        self.patches, self.persistent, self.mark_persistent = patches, persistent, mark_persistent
        self.variants: dict[str, list] = {}
        self.fallbacks: dict[str, object] = {}     # name -> torch.compile'd fn where saving failed

    def _load(self, path: Path, args: tuple):
        """load_compiled_function with the guard state's locals set to the real arguments: its
        pickled guard tree holds no nn.Modules, and rebuilding the guards reads through them."""
        scope = inspect.signature(self.fn).bind(*args).arguments
        original = dynamo_package.load_guards_state

        def load_guards_state(data):
            state = original(data)
            state.output_graph.local_scope.update(scope)
            return state

        dynamo_package.load_guards_state = load_guards_state
        try:
            with open(path, "rb") as fh, torch._guards.tracing(torch._guards.TracingContext(None)):
                f = torch.compiler.load_compiled_function(fh, f_globals=self.fn.__globals__)
        finally:
            dynamo_package.load_guards_state = original
        f.disable_guard_check()     # call() checks the guards itself, once
        return f

    def _compile(self, name: str, args: tuple, mark, progress):
        path = self.folder / f"{_slug(name)}.{len(self.variants[name])}.bin"
        with progress.build(name, "compiled"):
            mark()
            self.mark_persistent()
            # a copy: torch.compile pops guard_filter_fn from the dict it is given, so a second graph
            # of this function traced with the same dict kept every guard (automatic k's 1-token
            # verification failed to save on a pytree-registry guard)
            compiled = torch.compile(self.fn, backend=self.backend, fullgraph=True,
                                     options=dict(self.options))
            with self.patches():
                f = compiled.aot_compile((args, {}))
            self.folder.mkdir(parents=True, exist_ok=True)
            f.save_compiled_function(str(path))     # written atomically
            unmark([*self.persistent(), *_tensors(args)])
            return self._load(path, args)

    def call(self, name: str, args: tuple, mark, progress):
        """fn(*args) through the first saved or compiled graph of `name` whose guards pass;
        mark() applies the arguments' dimension marks (called only when compiling). A name whose
        graph cannot be saved (a marker file says so to later runs) or whose inputs keep failing
        the saved guards goes through torch.compile instead, alone: the other names stay saved."""
        variants = self.variants.get(name)
        if variants is None:        # the first call of `name`: its marker, else its saved files
            variants = self.variants[name] = []
            if (self.folder / f"{_slug(name)}.unsavable").exists():
                self._fall_back(name, None)
            for path in [] if name in self.fallbacks else sorted(self.folder.glob(f"{_slug(name)}.*.bin")):
                try:
                    with progress.build(name, "loaded"):
                        variants.append(self._load(path, args))
                except Exception as err:  # noqa: BLE001 - a stale or foreign file: compile instead
                    print(f"engine.compile: {path} could not be loaded ({type(err).__name__}: {err}); "
                          "compiling it again", file=sys.stderr)
        if name not in self.fallbacks and saving_off():      # the cache cannot be written: compile only
            self._fall_back(name, None)
        fallback = self.fallbacks.get(name)
        if fallback is not None:
            mark()
            self.mark_persistent()
            try:
                with self.patches(), progress.call(name):
                    return fallback(*args)
            finally:    # marks left on the shared cache tensors would fail other graphs' saved guards
                unmark([*self.persistent(), *_tensors(args)])
        for f in variants:
            if f.guard_check(*args):
                return f(*args)
        if len(variants) >= MAX_VARIANTS:      # guards that keep failing: stop saving more
            self._fall_back(name, f"{len(variants)} saved graphs and none fits these inputs")
            return self.call(name, args, mark, progress)
        if variants:
            print(f"engine.compile: {name}: no saved graph fits these inputs "
                  f"({_failed_guard(variants[-1], args)}); compiling another", file=sys.stderr, flush=True)
        try:
            with graph_lock(self.folder, _slug(name)) as waited:     # another process may be building it
                f = (self._load_new(name, args, progress) if waited else None) or self._compile(
                    name, args, mark, progress)
        except Exception as err:  # noqa: BLE001 - the precompile path is an optimisation
            unmark([*self.persistent(), *_tensors(args)])
            if (disk := is_save_error(err)) is not None:    # full, read-only, file-size limit: one warning
                saving_failed(self.folder, disk)
                return self.call(name, args, mark, progress)
            atomic_write_text(self.folder / f"{_slug(name)}.unsavable", f"{type(err).__name__}: {err}\n")
            self._fall_back(name, f"cannot be saved for later runs ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''})")
            return self.call(name, args, mark, progress)
        if f not in variants:
            variants.append(f)
        return f(*args)

    def _load_new(self, name: str, args: tuple, progress):
        """The first saved graph of `name` not loaded yet whose guards pass `args` (one another
        process saved while this one waited for its lock), appended to the variants; else None."""
        variants = self.variants[name]
        for path in sorted(self.folder.glob(f"{_slug(name)}.*.bin"))[len(variants):]:
            try:
                with progress.build(name, "loaded"):
                    f = self._load(path, args)
            except Exception:  # noqa: BLE001 - a stale or foreign file: compile instead
                continue
            variants.append(f)
            if f.guard_check(*args):
                return f
        return None

    def _fall_back(self, name: str, reason: str | None):
        """Compile `name` with torch.compile from now on (reason: the line to print; None: a
        marker of an earlier run said so)."""
        if reason is not None:
            print(f"engine.compile: {name}: {reason}; compiling it with torch.compile (a later run "
                  "traces it again)", file=sys.stderr, flush=True)
        f = self.fallbacks[name] = torch.compile(own_code(self.fn), backend=self.backend,
                                                 options=dict(self.fallback_options))
        return f
