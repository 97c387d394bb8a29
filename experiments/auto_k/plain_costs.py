"""Plain decoding's decode step at batch 1, 4, 16 and 64 on checkpoints/demo (eager, 2 threads),
for predict.py: mtpx.engine.calibration.calibrate on an engine without a speculator.

    python experiments/auto_k/plain_costs.py > experiments/auto_k/plain_costs.json
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx.engine.calibration import calibrate  # noqa: E402

torch.set_num_threads(2)
rows = calibrate(str(ROOT / "checkpoints" / "demo"), None, [0], [1, 4, 16, 64], steps=12, max_model_len=1024)
print(json.dumps([{"batch_size": r["batch_size"], "step_ms": r["step_ms"], "steps": r["steps"]} for r in rows], indent=1))
