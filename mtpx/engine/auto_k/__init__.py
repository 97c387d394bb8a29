"""Automatic k (`num_speculative_tokens=auto`): the measuring side, in two modules that import in
one direction (the depth policy itself, FixedDraftLength and AutoDraftLength, is the scheduler
side's mtpx/core/draft_length.py: pure decisions, no I/O, no tensors):

- costs.py: measure the decode step's cost per k and batch size (calibrate_step_costs), and the
  offline goodput model (predict, recommend); smooth_step_costs (the cost curve over k) is the
  policy's, re-exported.
- store.py: the step-cost files: cache path under $MTPX_CACHE_DIR, metadata, load and save, and
  the start-up path (startup_step_costs, load_or_calibrate).

Import the module you need (this package imports neither).
"""
