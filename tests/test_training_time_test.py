"""EAGLE-3's training-time test for unrolled single-module training (train.mtp_unroll_ttt,
mtpx/train/chains.py): the unrolled training forward equals the module outputs of the engine's own
mtp1 draft round on the same tokens, and the plain unroll (one causal pass per step) does not.

Tolerance: the model is float64; the engine's paged attention and this path reach the outputs by
different routes and agree to 1e-7 (measured: 5e-9 at most, outputs of order 1), while the plain
unroll differs by more than 1e-3."""
from __future__ import annotations

import pytest
import torch

from mtpx.train import checkpoint as ckpt
from mtpx.train.chains import ttt_chain, unrolled_chain
from mtpx.train.loop import train
from mtpx.train.losses import LossOptions, mtp_objective
from tests.helpers import _params, make_llm, peaked_model, tiny_config
from tests.test_train import run_cfg, write_synthetic_gsm8k
from tests.test_train_recipes import _ids, _model

K = 3
TOL = 1e-7


def _engine_round(model, prompt: list[int]):
    """The module outputs of the engine's first mtp1 round (k = 3) after the prompt's prefill:
    (step 1 over positions 0..n-1 [n, H], steps 2..K at the anchor [K-1, H], the drafts d_1..d_K,
    the target's first token)."""
    calls, forward = [], model.mtp[0].forward

    def recorded(emb, hidden, positions, cache=None, meta=None):
        out = forward(emb, hidden, positions, cache, meta)
        calls.append((positions.clone(), out.detach().clone()))
        return out

    model.mtp[0].forward = recorded
    try:
        outs = make_llm(model, "mtp1", K).generate([prompt], [_params(2)])
    finally:
        del model.mtp[0].forward
    (p1, a1), *steps = calls[:K]
    n = len(prompt)
    assert p1[0].tolist() == list(range(n))                        # step 1 over the prompt's positions
    assert [int(p[0, 0]) for p, _ in steps] == list(range(n, n + K - 1))   # step k at j + k - 1
    with torch.no_grad():
        drafts = [int(model.lm_head(a[0, -1]).argmax()) for _, a in calls[:K]]
    return a1[0], torch.stack([a[0, 0] for _, a in steps]), drafts, outs[0].output_token_ids[0]


def test_unrolled_training_forward_equals_the_engines_draft_chain():
    model = peaked_model(tiny_config(num_nextn_predict_layers=1))
    prompt = list(range(5, 17))
    step1, later, drafts, first = _engine_round(model, prompt)
    n = len(prompt)
    # the same tokens: the prompt, the target's token, then the drafts steps 2..K read
    ids = torch.tensor([prompt + [first] + drafts[: K - 1]])
    with torch.no_grad():
        h = model.model(ids)
        chain = ttt_chain(model, ids, h, K)
        plain = unrolled_chain(model, ids, h, [0] * K)
    anchor = n - 1
    torch.testing.assert_close(chain[0][0, :n], step1, rtol=0, atol=TOL)
    for k in range(2, K + 1):
        torch.testing.assert_close(chain[k - 1][0, anchor], later[k - 2], rtol=0, atol=TOL)
        # the plain unroll's context and positions are not inference's
        assert (plain[k - 1][0, anchor] - later[k - 2]).abs().max() > 1e-3
    with torch.no_grad():
        assert [int(model.lm_head(chain[k][0, anchor]).argmax()) for k in range(K)] == drafts


def test_ttt_objective_trains_and_its_first_step_is_the_plain_one():
    model, ids = _model(1), _ids(2, 16)
    opts = LossOptions(mtp_unroll_ttt=True)
    loss, parts = mtp_objective(model, ids, mtp_loss_weight=0.3, mtp_unroll=3, train_base=False,
                                options=opts)
    _, plain = mtp_objective(model, ids, mtp_loss_weight=0.3, mtp_unroll=3, train_base=False)
    assert parts["mtp1"] == pytest.approx(plain["mtp1"], rel=1e-6)     # step 1: one causal pass, both
    assert abs(parts["mtp2"] - plain["mtp2"]) > 1e-5         # float32 noise is ~1e-7 here
    loss.backward()
    assert model.mtp[0].fc.weight.grad.abs().sum() > 0


def test_train_runs_the_training_time_test_with_an_lk_loss(tmp_path):
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl", n=120)
    cfg = run_cfg(tmp_path, "ttt", steps=2, eval_every=0, mtp_unroll=2, mtp_unroll_ttt=True,
                  mtp_loss="lk_hybrid")
    cfg["model"]["num_nextn_predict_layers"] = 1
    out = train(cfg)
    hist = ckpt.load_trainer_state(out)["loss_history"]
    assert {"mtp1", "mtp2"} <= set(hist[-1])
    bad = run_cfg(tmp_path, "ttt_bad", mtp_unroll_ttt=True)
    with pytest.raises(ValueError, match="train.mtp_unroll_ttt=true .* set train.mtp_unroll=K"):
        train(bad)
