"""How many torch threads to decode with.

torch's default (one thread per core) collapses when another process keeps a core busy: its
OpenMP threads wait on each other and a decode step can run tens of times slower. So the CLI
chooses deliberately (`choose_threads`): an explicit setting wins, then `OMP_NUM_THREADS`; else
the CPUs this process may use (affinity and the cgroup's CPU quota) bound a short measurement of
the model's forward at each candidate count, and the fastest wins (fewer threads on a tie).
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch


ONE_CPU = "the only CPU available"   # the reason when there is nothing to choose


@dataclass
class ThreadChoice:
    """threads: the count set; reason: why (one phrase, for the run header); forward_ms: the
    measured median forward time per candidate count (empty when nothing was measured)."""
    threads: int
    reason: str
    cpus: int
    forward_ms: dict[int, float] = field(default_factory=dict)

    def describe(self) -> str:
        measured = ", ".join(f"{n}: {ms:.2f} ms" for n, ms in sorted(self.forward_ms.items()))
        cpus = "" if self.reason == ONE_CPU else f"; {self.cpus} CPU{'' if self.cpus == 1 else 's'} available"
        return (f"threads: {self.threads} ({self.reason}{cpus}"
                + (f"; forward at 1 x 16 tokens {measured}" if measured else "") + ")")


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, bounded by a cgroup CPU quota (v2
    cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us) when one is set."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    return max(1, min(n, math.ceil(quota))) if quota is not None else max(1, n)


def _cgroup_quota() -> float | None:
    try:
        v2 = Path("/sys/fs/cgroup/cpu.max")
        if v2.is_file():
            q, period = v2.read_text().split()[:2]
            return None if q == "max" else int(q) / int(period)
        q = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
        if q.is_file():
            quota, period = int(q.read_text()), int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
            return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None
    return None


@torch.inference_mode()
def choose_threads(model: torch.nn.Module | None, requested: int | None = None, key: str = "eval.threads",
                   repeats: int = 5) -> ThreadChoice:
    """Pick and set torch's thread count (module doc). requested: an explicit count (`key` names
    where it came from); model: measured when nothing is requested (None: use every CPU).
    Raises ValueError for requested < 1."""
    cpus = available_cpus()
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"{key}={requested!r}: must be an integer >= 1, or null (measured at start-up)")
        choice = ThreadChoice(requested, key, cpus)
    elif (env := os.environ.get("OMP_NUM_THREADS", "").strip()).isdigit() and int(env) >= 1:
        choice = ThreadChoice(int(env), "OMP_NUM_THREADS", cpus)
    else:
        candidates = sorted({1, 2, 4, 8, 16, 32, 64, cpus} & set(range(1, cpus + 1)))
        if model is None:
            choice = ThreadChoice(cpus, "every available CPU", cpus)
        else:
            times = {n: forward_ms(model, n, repeats) for n in candidates}
            best = min(times.values())
            pick = min(n for n, ms in times.items() if ms <= 1.1 * best)   # fewer threads within 10%
            choice = ThreadChoice(pick, "measured fastest" if len(candidates) > 1 else ONE_CPU,
                                  cpus, times)
    if model is not None and choice.threads not in choice.forward_ms:
        choice.forward_ms[choice.threads] = forward_ms(model, choice.threads, repeats)
    torch.set_num_threads(choice.threads)
    return choice


def oversubscription_warning(requested: int | None, tp_size: int = 1, key: str = "eval.threads",
                             cpus: int | None = None) -> str | None:
    """One warning line when the threads asked for (`requested` per rank, None: chosen by
    choose_threads, at most the CPUs) times engine.tensor_parallel_size ranks exceed the CPUs this
    process may use (threads then wait on each other: a step can run many times slower); None
    otherwise. The run goes on: the setting is legal, only slow."""
    cpus = available_cpus() if cpus is None else cpus
    if tp_size > cpus:
        return (f"warning: engine.tensor_parallel_size={tp_size} is more than the {cpus} CPU(s) this "
                "process may use: the ranks wait on each other (slower than one rank); lower "
                "engine.tensor_parallel_size")
    if requested is None or requested * tp_size <= cpus:
        return None
    ranks = f" on each of engine.tensor_parallel_size={tp_size} ranks" if tp_size > 1 else ""
    return (f"warning: {key}={requested}{ranks} is more than the {cpus} CPU(s) this process may use: "
            f"threads wait on each other (often many times slower); set {key}={max(1, cpus // tp_size)} "
            "or null (measured at start-up)")


@torch.inference_mode()
def forward_ms(model: torch.nn.Module, threads: int, repeats: int = 5) -> float:
    """Median ms of the model's forward over 1 x 16 random tokens at `threads` threads (left set)."""
    p = next(model.parameters())
    ids = torch.randint(0, model.cfg.vocab_size, (1, 16), device=p.device)
    torch.set_num_threads(threads)
    model(ids)                                   # untimed: first call at this count
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(ids)
        samples.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(samples)


def contention_warning(model: torch.nn.Module, choice: ThreadChoice, factor: float = 2.0) -> str | None:
    """Time the start-up forward again; a line when it is `factor` times slower than it was (the
    machine got busier during the run: its throughput figures are not comparable), else None."""
    before = choice.forward_ms.get(choice.threads)
    if before is None:
        return None
    now = forward_ms(model, choice.threads)
    if now < factor * before:
        return None
    return (f"warning: the model's forward now takes {now:.2f} ms, {now / before:.1f}x its {before:.2f} ms "
            f"at start-up with {choice.threads} threads: another process is using the CPUs, so this run's "
            "throughput is not comparable (stop it, or set fewer threads)")
