"""Processes of a tensor-parallel engine: rank 0 (the driver: scheduler, client side) starts the
N-1 workers itself (fresh `python -m mtpx.parallel.spmd` processes) or all N run under `torchrun
--nproc_per_node=N`; every rank joins one process group (gloo on the CPU, NCCL on CUDA) and runs
the same model-runner calls on its shard: the driver broadcasts each call
(broadcast_object_list) and runs it too, the workers run what they receive (`serve`).

Failure: a collective with a dead peer fails at once (its sockets close) or after TIMEOUT_S (a
hung peer); the driver then raises TensorParallelError naming the worker and its exit code, and a
worker whose driver died leaves its loop with an error and exits. Workers started here also
get SIGKILL when the driver process dies (Linux's PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import atexit
import datetime
import importlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from mtpx.parallel.group import TPGroup

TIMEOUT_S = 300
"""Seconds a collective waits for a peer (a hung worker) before the driver fails (gloo's timeout)."""


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died or stopped answering: the engine cannot continue (`fatal`:
    mode=serve fails its requests and stops)."""

    fatal = True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    """True in a process torchrun started (its RANK, WORLD_SIZE and MASTER_ADDR are set)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_group(rank: int | None, world_size: int, port: int | None, device: str = "cpu") -> TPGroup:
    """Join the process group (gloo, or NCCL for a CUDA device) as `rank` of `world_size` over
    127.0.0.1:port, or from torchrun's environment when port is None. Returns the TPGroup."""
    backend = "nccl" if str(device).startswith("cuda") else "gloo"
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if port is None:
        rank = int(os.environ["RANK"])
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timeout)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    return TPGroup(rank, world_size)


class Worker:
    """A worker process started by start_workers (a subprocess.Popen with a name)."""

    def __init__(self, popen: subprocess.Popen, name: str):
        self.popen, self.name, self.pid = popen, name, popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        self.popen.kill()

    def join(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


def _die_with_parent() -> None:
    """In a worker before exec (Linux): SIGKILL when the driver dies, however it dies."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_workers(target: str, world_size: int, args: tuple) -> tuple[list[Worker], int]:
    """Start ranks 1 .. world_size-1 as fresh Python processes (`python -m mtpx.parallel.spmd`;
    no fork, and the caller's main module is not imported again, so scripts need no
    `if __name__ == "__main__"` guard) running target(rank, world_size, port, *args), target a
    "module:function" name and args pickled to the process's stdin. Returns (the workers, the
    port rank 0 joins with init_group)."""
    port = free_port()
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    workers = []
    for rank in range(1, world_size):
        p = subprocess.Popen([sys.executable, "-m", "mtpx.parallel.spmd", target,
                              str(rank), str(world_size), str(port)],
                             stdin=subprocess.PIPE, env=env,
                             preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        p.stdin.write(pickle.dumps(args))
        p.stdin.close()
        workers.append(Worker(p, f"rank {rank}"))
    return workers, port


class Driver:
    """Rank 0's side: call(method, *args) broadcasts (method, args) to the workers, then the
    caller runs the same call locally. procs: the workers started here (None under torchrun)."""

    def __init__(self, tp: TPGroup, procs: list | None = None):
        self.tp, self.procs, self.closed = tp, procs, False
        self._ids = 0
        atexit.register(self.close)

    def new_id(self) -> int:
        """A fresh id for an object the workers keep (an engine)."""
        self._ids += 1
        return self._ids

    def broadcast(self, method: str, *args) -> None:
        self.check()
        try:
            dist.broadcast_object_list([(method, args)], src=0)
        except Exception as err:  # noqa: BLE001 - any failure of the group is a dead or hung worker
            raise self.failure(err) from None

    def check(self) -> None:
        """Raises TensorParallelError when a worker started here has exited."""
        if self.closed:
            raise TensorParallelError("the tensor-parallel workers were shut down: create a new engine")
        for p in self.procs or []:
            if not p.is_alive():
                raise self.failure(None)

    def failure(self, err: BaseException | None) -> TensorParallelError:
        """The error to raise after a collective failed with `err` (None: a worker was seen dead)."""
        dead = [p for p in self.procs or [] if not p.is_alive()]
        # a peer's sockets close before it is reaped
        for p in [] if dead or err is None else self.procs or []:
            p.join(2)
            dead += [] if p.is_alive() else [p]
        if dead:
            p = dead[0]
            who = f"tensor-parallel worker {p.name} (pid {p.pid}) exited with code {p.exitcode}"
        else:
            who = f"a tensor-parallel collective failed ({str(err).splitlines()[0] if err else 'no reason'})"
        self.abandon()
        return TensorParallelError(f"{who}: the engine cannot continue; restart it "
                                   f"(engine.tensor_parallel_size={self.tp.world_size})")

    def abandon(self) -> None:
        """After a failure: stop the other workers (they would wait for TIMEOUT_S) and leave."""
        self.closed = True
        for p in self.procs or []:
            if p.is_alive():
                p.kill()
        for p in self.procs or []:
            p.join(5)

    def close(self) -> None:
        """Tell the workers to stop, wait for them, leave the process group (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            if all(p.is_alive() for p in self.procs or []):
                dist.broadcast_object_list([("shutdown", ())], src=0)
        except Exception:  # noqa: BLE001 - shutting down anyway
            pass
        for p in self.procs or []:
            p.join(10)
            if p.is_alive():
                p.kill()
        if dist.is_initialized():
            dist.destroy_process_group()


def serve(target, tp: TPGroup) -> None:
    """A worker's loop: run target.<method>(*args) for every (method, args) rank 0 broadcasts,
    until "shutdown". A failed collective (the driver died) ends the process with exit code 1."""
    try:
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            method, args = box[0]
            if method == "shutdown":
                break
            getattr(target, method)(*args)
    except Exception:  # noqa: BLE001 - report and exit: the driver sees this rank gone
        print(f"mtpx tensor-parallel worker rank {tp.rank}: stopping after an error:\n"
              f"{traceback.format_exc()}", file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":      # a worker started by start_workers: module:function rank world_size port
    _module, _fn = sys.argv[1].split(":")
    _args = pickle.loads(sys.stdin.buffer.read())
    getattr(importlib.import_module(_module), _fn)(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                                   *_args)
