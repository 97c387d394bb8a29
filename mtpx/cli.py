"""What `train_or_eval.py` runs: mode=train trains and checkpoints, mode=eval decodes a prompt set
and reports spec-decode metrics (with the lossless check), mode=bench is the serving benchmark
(the bench group's client, no lossless pass), mode=serve the HTTP server, mode=distill writes
self-distilled training data. Errors a user can fix (bad input, a full, read-only or forbidden
disk: mtpx.io.disk_error_line) are printed as one line, exit code 2."""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mtpx.io import (Interrupted, atomic_write_text, check_writable_dir, disk_error_line, sigterm_as_ctrl_c,
                     source_commit, stop_exit_code, stop_signal_name)
from mtpx.metrics.logging import RunLogger
from mtpx.metrics.launchers import set_job_threads
from mtpx.schema import RunConfig, compose_error, group_choices

USER_ERRORS = (ValueError, FileNotFoundError, KeyError)


GROUP_NAMES = {"spec": "spec", "data": "data set", "model": "model config", "train": "train config",
               "engine": "engine config", "eval": "eval config", "bench": "bench config",
               "serve": "serve config", "distill": "distill config", "logger": "logger"}


def check_group_overrides(argv: list[str], conf_dir: Path) -> str | None:
    """Hydra's own message for an unknown config group option spans a dozen lines; return one
    error line naming the choices instead (None when every `[+]group=name[,name...]` exists)."""
    has_spec = any(a.startswith("+spec=") for a in argv)
    for arg in argv:
        if arg.startswith("spec="):
            return f"spec is not in the defaults list: add it with '+{arg}'"
        if arg.startswith(("spec.", "+spec.")) and not has_spec:
            return (f"'{arg}' needs a speculator: add +spec=mtp1 or +spec=mtp8 before it "
                    "(without +spec the run decodes without speculation)")
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUP_NAMES or not value:
            continue
        choices = group_choices(key, conf_dir)
        for name in value.split(","):
            if name not in choices:
                return (f"unknown {GROUP_NAMES[key]} '{name}': choose one of {', '.join(choices)} "
                        f"({'+' if key == 'spec' else ''}{key}=NAME)")
    return None


def check_run_dirs(argv: list[str]) -> str | None:
    """One error line when the folder Hydra would create for the run (hydra.run.dir, or
    hydra.sweep.dir with -m / --multirun; default outputs/ and multirun/ under the working
    directory) cannot be created or written (read-only, under /proc, a file in the way), which
    Hydra reports as a traceback; None otherwise. Only the part before the first ${...} is
    checked, and nothing is created."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    value = next((a.partition("=")[2] for a in argv if a.lstrip("+").startswith(key + "=")),
                 "multirun/${now:}" if multirun else "outputs/${now:}")
    fixed = value.split("${")[0]
    if "${" in value:                                  # the last, partial component is unknown
        fixed = fixed[: fixed.rfind("/") + 1] if "/" in fixed else ""
    try:
        check_writable_dir(Path(fixed or "."), key, create=False, shown=value)
    except ValueError as e:
        return str(e)
    return None


def check_overrides(argv: list[str], conf_dir: Path) -> str | None:
    """What `train_or_eval.py` checks before Hydra's main: group options, the composed config
    against its schema (mtpx.schema.compose_error), then the run folder (check_run_dirs). One
    error line, or None."""
    return check_group_overrides(argv, conf_dir) or compose_error(argv, conf_dir) or check_run_dirs(argv)


def run_dir() -> Path:
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # called outside Hydra (tests)
        return Path.cwd()


class _LogTee:
    """A stdout / stderr wrapper that also writes each complete line to the Hydra job's log file
    (`train_or_eval.log` in the run folder), so the file holds the run's output. Lines that redraw
    a live display (carriage returns, terminal escape codes) go to the terminal only."""

    def __init__(self, stream, file):
        self.stream, self.file, self.pending = stream, file, ""

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        if self.file.closed:             # a library closed the log handlers (logging.config)
            return n
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if "\r" not in line and "\x1b[" not in line:
                self.file.write(line + "\n")
        self.file.flush()
        return n

    def flush(self) -> None:
        self.stream.flush()
        if not self.file.closed:
            self.file.flush()

    def __getattr__(self, name):        # isatty, fileno, encoding ... of the real stream
        return getattr(self.stream, name)


def _job_log_file():
    """The stream of the Hydra job's log file handler, or None (outside Hydra, or no file log)."""
    import logging
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            return h.stream
    return None


def run(cfg: DictConfig) -> int:
    """Dispatch on cfg.mode (stdout and stderr also go to the Hydra job's log file). Returns the
    process exit code."""
    set_job_threads()     # a job of a parallel launcher: its share of the CPUs (mtpx.metrics.launchers)
    log = _job_log_file()
    if log is None:
        code = _run(cfg)
    else:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _LogTee(out, log), _LogTee(err, log)
        try:
            code = _run(cfg)
        finally:
            sys.stdout, sys.stderr = out, err
    if code == 2:
        _drop_empty_run_dir()
    return code


HYDRA_FILES = {".hydra", "train_or_eval.log", "error.txt"}   # what a run folder holds before the run writes


def _drop_empty_run_dir() -> None:
    """After a bad-input error (exit 2) of a single run, remove its Hydra run folder when it holds
    nothing but Hydra's own files and error.txt (the error line was printed), so a failed start
    leaves no empty run behind. A multirun keeps its job folders (the sweep table reads
    error.txt), and a folder with anything else (an earlier run's outputs) is kept."""
    import shutil

    from hydra.types import RunMode
    try:
        hc = HydraConfig.get()
    except ValueError:               # outside Hydra (tests, the API)
        return
    if hc.mode != RunMode.RUN:
        return
    out = Path(hc.runtime.output_dir)
    try:
        if out.is_dir() and {p.name for p in out.iterdir()} <= HYDRA_FILES:
            shutil.rmtree(out)
    except OSError:
        pass


def _run(cfg: DictConfig) -> int:
    """cfg.mode's run; SIGTERM acts as Ctrl-C (mtpx.io) except in mode=serve, whose server
    handles both itself. Returns the exit code (2: bad input; 130 / 143: Ctrl-C / SIGTERM)."""
    if cfg.get("mode") == "serve":
        return _dispatch(cfg)
    with sigterm_as_ctrl_c():
        return _dispatch(cfg)


def _dispatch(cfg: DictConfig) -> int:
    try:
        RunConfig.check("", cfg)                  # mode: one of RunConfig.mode's choices
        if cfg.mode == "train":
            return run_train(cfg)
        if cfg.mode == "eval":
            from mtpx.evaluate import run_eval
            return run_eval(cfg, run_dir())
        if cfg.mode == "bench":
            from mtpx.evaluate import run_bench
            return run_bench(cfg, run_dir())
        if cfg.mode == "serve":
            from mtpx.serve.server import run_serve
            return run_serve(cfg)
        if cfg.mode == "extract":
            from mtpx.train.extract import run_extract
            return run_extract(cfg)
        from mtpx.distill import run_distill      # mode=distill
        return run_distill(cfg)
    except USER_ERRORS as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        _record_error(f"error: {msg}")
        return 2
    except Interrupted as e:
        line = f"{_interrupted()}: {e}"
    except Exception as e:           # a full, read-only or forbidden disk: one line, else the traceback
        line = disk_error_line(e)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        _record_error(f"error: {line}")
        return 2
    except KeyboardInterrupt:
        line = (f"{_interrupted()}: stopped at once; the run's final files were not written (what it wrote "
                "before, e.g. finished rows in outputs.jsonl or saved checkpoints, is kept)")
    print(line, file=sys.stderr)
    _record_error(line)
    return stop_exit_code()


def _interrupted() -> str:
    return "interrupted" if stop_signal_name() == "SIGINT" else "interrupted by SIGTERM"


def _record_error(line: str) -> None:
    """Keep a failed job's error in its Hydra run folder (error.txt), so a sweep's table
    (tools/sweep_table.py) can say why it failed. Outside Hydra (tests, the API) nothing is written."""
    try:
        out = Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return
    try:
        atomic_write_text(out / "error.txt", line + "\n")
    except OSError:                  # a full or read-only disk: the line on stderr is all there is
        pass


def run_train(cfg: DictConfig) -> int:
    """mode=train (also each rank of `torchrun ... mode=train`: only rank 0, RANK=0 or unset,
    logs to W&B and prints the checkpoint line)."""
    import os

    from mtpx.train.loop import train

    main_rank = int(os.environ.get("RANK", "0")) == 0
    logger_cfg = OmegaConf.to_container(cfg.logger, resolve=True) if main_rank else {"name": "none"}
    # what mode=train reads
    used = {k: cfg[k] for k in ("mode", "seed", "data_dir", "model", "train", "logger") if k in cfg}
    run_id = _resumed_wandb_id(cfg) if main_rank else None
    config = {**OmegaConf.to_container(OmegaConf.create(used), resolve=True), "commit": source_commit()}
    from mtpx.evaluate import _sweep_group
    group, _ = _sweep_group()    # the jobs of one multirun share a W&B group, on any launcher
    logger = RunLogger(logger_cfg, run_dir=run_dir(), config=config, group=group,
                       run_name=f"train-{Path(str(cfg.train.out_dir)).name}", run_id=run_id)
    try:   # on_config: the architecture trained (a checkpoint's with model.path) and the thread count
        path = train(cfg, log_fn=logger.log,
                     extra_state={"wandb_run_id": logger.run_id} if logger.run_id else None,
                     on_config=logger.update_config)
        logger.log_images([Path(path) / "loss_curve.png"])
    finally:
        logger.finish()
    if main_rank:
        print(f"checkpoint: {path}")
    return 0


def _resumed_wandb_id(cfg: DictConfig) -> str | None:
    """The W&B run id a resumed training run logged to (its trainer_state.json), so the resumed
    run continues that W&B run; None for a fresh run."""
    import json
    state = Path(str(cfg.train.out_dir)) / "trainer_state.json"
    if not cfg.train.get("resume", True) or not state.is_file():
        return None
    try:
        return json.loads(state.read_text()).get("wandb_run_id")
    except (OSError, ValueError):
        return None
