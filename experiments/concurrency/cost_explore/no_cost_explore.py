"""tools/bench_speedup.py with automatic k's cost exploring off (AutoDraftLength(explore_costs=False);
the running-median smoothing and the probes' part measurements stay): separates the two changes.

    MTPX_DATA_DIR=../shared/data python experiments/concurrency/cost_explore/no_cost_explore.py \
        --concurrency 4 ...
"""
import runpy
import sys
from pathlib import Path

from mtpx.core import draft_length

ROOT = Path(__file__).resolve().parents[3]
init = draft_length.AutoDraftLength.__init__


def without_cost_exploring(self, *args, **kwargs):
    kwargs["explore_costs"] = False
    init(self, *args, **kwargs)


draft_length.AutoDraftLength.__init__ = without_cost_exploring
sys.argv = [str(ROOT / "tools" / "bench_speedup.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
