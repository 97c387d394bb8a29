"""Automatic k with every request at depth 0 and a step without drafts: its prefill and decode run
exactly plain decoding's tensor operations (mtpx/engine/model_runner.py, `_prefill`'s depth-0 path;
`_decode` holds nothing), and requests admitted deeper afterwards still draft from exact module KV."""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import _params, assert_clean, install_draft_check, make_llm, run_checked
from tests.test_auto_k import forced_engine, model
from tests.test_reprefill import assert_module_kv_exact


class _Ops(TorchDispatchMode):
    """The aten operator names dispatched while active, in order."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _record_runner_ops(llm) -> list[tuple[str, list[str]]]:
    """Wrap the runner's prefill and decode: each call's (name, aten operators) appended."""
    runner, calls = llm.engine.runner, []

    def recorder(name: str, fn):
        def wrapped(*args, **kwargs):
            with _Ops() as ops:
                out = fn(*args, **kwargs)
            if args[0]:                           # the step had prefill chunks / decodes
                calls.append((name, ops.names))
            return out
        return wrapped
    for name in ("_prefill", "_decode"):
        setattr(runner, name, recorder(name, getattr(runner, name)))
    return calls


def _depth0_engine(**kw):
    """A mtp8 engine (k = 4) whose policy admits every request at depth `forced_depth` (depth per
    request, as automatic k) and forces every step's k."""
    llm, policy = forced_engine("mtp8", 4, **kw)
    llm.engine.scheduler.depth_per_request = True
    policy.forced, policy.forced_depth = 0, 0
    return llm, policy


def test_a_step_without_drafts_at_depth_0_runs_plain_decoding_s_operations():
    """Two prompts (one of them prefilled in two chunks) decoded at k = 0, every request at depth
    0: each prefill and decode call of the runner dispatches the same aten operators, in the same
    order, as a plain engine's (no ring write, no module batch, no hold); greedy tokens equal."""
    prompts = [[5, 9, 13, 2, 40, 41, 7, 3, 3, 8, 1, 2], [3, 8, 8, 1]]
    params = [_params(7), _params(5)]
    auto, _ = _depth0_engine(max_num_batched_tokens=8, block_size=4, check_invariants=False)
    plain = make_llm(model(), max_num_batched_tokens=8, block_size=4, check_invariants=False)
    for llm in (auto, plain):      # the attention's scratch buffers grow once per process
        llm.generate(prompts, params)
    got, want = _record_runner_ops(auto), _record_runner_ops(plain)
    outs_auto, reqs = run_checked(auto, model(), prompts, params)
    outs_plain, _ = run_checked(plain, model(), prompts, params)
    assert [o.output_token_ids for o in outs_auto] == [o.output_token_ids for o in outs_plain]
    assert all(r.draft_depth == 0 for r in reqs.values())
    assert [n for n, _ in got] == [n for n, _ in want] and "_decode" in [n for n, _ in got]
    assert [n for n, _ in got].count("_prefill") == 2            # the long prompt's two chunks
    for (name, a), (_, b) in zip(got, want):
        assert a == b, (name, len(a), len(b))
    assert_clean(auto)


def test_requests_at_depth_0_then_deeper_ones_keep_exact_module_kv_and_plain_greedy():
    """Prefix caching on: two requests at depth 0 decode without drafts (the plain path), then
    three more sharing their prefixes are admitted at depth 4 while k alternates 0 and 4: after
    every step every module's KV at every computed position equals from-scratch, every proposal
    equals the from-scratch drafts, greedy tokens equal plain decoding's."""
    K = 4
    llm, policy = _depth0_engine(enable_prefix_caching=True, max_num_seqs=2, block_size=4)
    checked = install_draft_check(llm, model(), "mtp8", K)
    seen = []

    def on_step(engine):
        seen.append(policy.forced)
        assert_module_kv_exact(engine, model(), current=seen[-1] > 0)
        if len(seen) >= 8:                    # the first two requests are at depth 0 by now
            policy.forced_depth = K
            policy.forced = [0, 0, K, 0, K - 1, K][len(seen) % 6]

    base = [7, 3, 9, 12, 5, 5, 30, 2, 11, 4, 6]
    prompts = [base, base[:6] + [1, 2], base + [8, 9], base[:9] + [60], base[:5]]
    _, reqs = run_checked(llm, model(), prompts, [_params(n) for n in (12, 10, 16, 14, 12)], on_step=on_step)
    assert [reqs[i].draft_depth for i in range(5)] == [0, 0, K, K, K]
    assert checked and all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
    assert any(k > 0 for k in seen)
    assert_clean(llm)
