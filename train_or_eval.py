"""mtpx entry point (Hydra): `python train_or_eval.py [mode=train|eval] [+spec=mtp1|mtp8] [key=value ...]`.

Configs live in conf/; every run writes its outputs into its Hydra run directory.
"""
import sys

import hydra
from omegaconf import DictConfig

import mtpx.schema  # noqa: F401 - registers the structured configs that conf/*.yaml extend

_FAILED: list[int] = []  # exit codes of failed jobs of a multirun sweep


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from mtpx.cli import run

    code = run(cfg)
    if code and HydraConfig.get().mode == RunMode.MULTIRUN:
        _FAILED.append(code)  # a failed job does not stop the sweep; the exit status reports it
    elif code:
        sys.exit(code)


if __name__ == "__main__":
    from pathlib import Path

    from mtpx.cli import check_overrides

    error = check_overrides(sys.argv[1:], Path(__file__).resolve().parent / "conf")
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    main()
    from mtpx.metrics.launchers import sweep_exit_code
    sys.exit(sweep_exit_code(_FAILED))    # 0 for a single run; a multirun's failed jobs make it non-zero
