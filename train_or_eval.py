"""mtpx entry point (Hydra): `python train_or_eval.py [mode=train|eval] [+spec=mtp1|mtp8] [key=value ...]`.

Configs live in conf/; every run writes its outputs into its Hydra run directory.
"""
import sys

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from mtpx.cli import run

    code = run(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    from pathlib import Path

    from mtpx.cli import check_group_overrides

    error = check_group_overrides(sys.argv[1:], Path(__file__).resolve().parent / "conf")
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    main()
