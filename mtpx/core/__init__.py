"""The scheduler side of the engine (vLLM v1's core, apart from its worker): what each step runs
and the bookkeeping around it, in plain Python over token ids and block ids, no tensors.

- request.py: Request, a request's mutable state (its progress is the scheduler's to write).
- scheduler.py: Scheduler and its SchedulerOutput (ScheduledPrefill, ScheduledDecode).
- kv_cache_manager.py, block_pool.py: block tables, reference counts, prefix-cache hashes.
- step_plan.py: what the scheduler and the draft-length policy (mtpx/auto_k) exchange once per
  step (StepView, StepPlan, StepRecord), and `num_new_drafts`: a request drafts min(k, its depth).
- sampling_params.py, stop_strings.py: what a request asks for and the stop-string check.

Nothing here imports torch, numpy, rich, omegaconf or the worker side (mtpx.engine's runner and
compiled step, mtpx.cache's model cache and states): import-linter contracts in pyproject.toml and
tests/test_layers.py hold it. docs/architecture.md describes the split.
"""
