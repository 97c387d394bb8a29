"""The model runner's decode step: one device -> host transfer per step, and its RunnerOutput."""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from mtpx import LLM, SamplingParams
from mtpx.core.request import Request

# Tensor operations that read a value on the host (a device sync on CUDA) or whose output shape
# depends on values (the same, to size the output)
_SYNCS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
          torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero,
          torch.Tensor.numpy, torch.unique, torch.Tensor.unique, torch.masked_select,
          torch.Tensor.masked_select, torch.Tensor.cpu}


def _bool_index(args) -> bool:
    idx = args[1] if len(args) > 1 else None
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class SyncCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _SYNCS or (func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
                              and _bool_index(args)):
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _decoding_engine(model, spec, k, batch):
    llm = LLM(model=model, spec=spec, num_speculative_tokens=k, max_num_seqs=8, block_size=4,
              enable_prefix_caching=True)
    eng = llm.engine
    for i in range(batch):
        eng.add_request(Request(i, [(5 + 3 * i + j) % 60 + 2 for j in range(6 + i)],
                                SamplingParams(max_tokens=40, ignore_eos=True)))
    eng.step()                                   # every prompt prefilled in one step
    assert all(not r.is_prefilling for r in eng.scheduler.running)
    return llm


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp1", 3), ("mtp8", 4)])
def test_decode_step_reads_the_device_once(trained_tiny, spec, k):
    """A decode-only step (greedy, prefix caching on a hybrid: boundary states included) makes
    exactly one host read: the packed tokens / accepted counts / drafts / final positions."""
    llm = _decoding_engine(trained_tiny, spec, k, batch=3)
    runner = llm.engine.runner
    decode = runner._decode
    counts = []

    def counted(*args):
        with SyncCounter() as counter:
            out = decode(*args)
        counts.append(counter.calls)
        return out

    runner._decode = counted
    for _ in range(4):
        llm.engine.step()
    assert len(counts) == 4
    assert all(calls == ["tolist"] for calls in counts), counts


def test_sync_counter_sees_syncs():
    """The counter is not vacuous."""
    x = torch.arange(6)
    with SyncCounter() as c:
        x.tolist()
        bool(x.any())
        x[x > 2] = 0
        int(x.max())
    assert c.calls == ["tolist", "__bool__", "__setitem__", "__int__"]


def test_runner_output_of_a_decode_step(trained_tiny):
    """RunnerOutput: per request the verified tokens (accepted drafts + the next token), the raw
    accepted count, k next drafts and the final positions, consistent with what the scheduler
    then applies."""
    llm = _decoding_engine(trained_tiny, "mtp8", 4, batch=2)
    eng = llm.engine
    captured = {}
    execute = eng.runner.execute

    def capture(out):
        captured["out"], captured["result"] = out, execute(out)
        return captured["result"]

    eng.runner.execute = capture
    before = {r.index: r.num_tokens for r in eng.scheduler.running}
    eng.step()
    out, result = captured["out"], captured["result"]
    assert not out.prefills and len(out.decodes) == 2
    for d in out.decodes:
        res = result.results[d.request.index]
        assert len(res.token_ids) == res.num_accepted + 1 <= d.num_draft_tokens + 1
        assert len(res.draft_token_ids) == 4
        assert d.request.num_tokens == before[d.request.index] + len(res.token_ids)
        assert d.request.draft_token_ids == res.draft_token_ids
        assert d.request.num_computed_tokens == d.request.num_tokens - 1
        # target KV final through the new last position; the modules read every verified token
        assert res.num_final_tokens == d.request.num_tokens - 4
