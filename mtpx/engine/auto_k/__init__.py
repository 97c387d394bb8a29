"""Automatic k (`num_speculative_tokens=auto`), in three modules that import in one direction:

- policy.py: the depth policy (FixedDraftLength, AutoDraftLength): pure decisions (`decide`,
  `decide_depth`) apart from the updates that apply them (`commit`, `commit_depth`) and learn
  from a step (`record`, `observe`, `observe_step`); no I/O, no tensors.
- costs.py: measure the decode step's cost per k and batch size (calibrate_step_costs), fit the
  cost curve over k (smooth_step_costs), and the offline goodput model (predict, recommend).
- store.py: the step-cost files: cache path under $MTPX_CACHE_DIR, metadata, load and save, and
  the start-up path (startup_step_costs, load_or_calibrate).

Import the module you need (this package imports none of them, so the scheduler's policy import
does not pull in torch).
"""
