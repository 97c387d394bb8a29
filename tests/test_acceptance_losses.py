"""train.mtp_loss (mtpx/train/acceptance_losses.py): each loss on hand-made distributions against
its value worked out by hand, the gradients LK^lambda's detached weight gives, and the objective
with a distribution loss recomputed from the model's blocks."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from mtpx import schema
from mtpx.schema.train_group import TrainConfig
from mtpx.train.acceptance_losses import (TopK, acceptance, depth_loss, kl_loss, lk_hybrid_loss, lk_nll_loss,
                                          target_log_probs, tv_loss)
from mtpx.train.losses import LossOptions, mtp_objective
from tests.test_train_recipes import _ids, _model

# p: the target's distribution; the draft's logits give q = uniform over 4 tokens
P = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
LOG_P = torch.log(P)                            # -inf at the token p never emits
Q_LOGITS = torch.zeros(1, 4)                    # q = [0.25] * 4
TOL = dict(rtol=0, atol=1e-6)


def test_acceptance_tv_kl_and_lk_on_a_hand_made_pair():
    # alpha = sum min(p, q) = .25 + .25 + .2 + 0
    assert acceptance(Q_LOGITS, LOG_P).item() == pytest.approx(0.7, abs=1e-7)
    # TV = 1/2 (|.5-.25| + |.3-.25| + |.2-.25| + |0-.25|) = 0.3 = 1 - alpha
    assert tv_loss(Q_LOGITS, LOG_P).item() == pytest.approx(0.3, abs=1e-7)
    kl = 0.5 * math.log(2) + 0.3 * math.log(1.2) + 0.2 * math.log(0.8)   # p = 0 term counts 0
    assert kl_loss(Q_LOGITS, LOG_P).item() == pytest.approx(kl, abs=1e-7)
    assert lk_nll_loss(Q_LOGITS, LOG_P).item() == pytest.approx(-math.log(0.7), abs=1e-7)
    lam = math.exp(-3 * 0.7)
    hybrid = lam * kl + (1 - lam) * 0.3
    assert lk_hybrid_loss(Q_LOGITS, LOG_P, eta=3.0).item() == pytest.approx(hybrid, abs=1e-7)
    # eta = 0: pure KL; a huge eta: pure TV
    assert lk_hybrid_loss(Q_LOGITS, LOG_P, eta=0.0).item() == pytest.approx(kl, abs=1e-7)
    assert lk_hybrid_loss(Q_LOGITS, LOG_P, eta=1e4).item() == pytest.approx(0.3, abs=1e-7)


def test_equal_distributions_cost_nothing_and_a_one_hot_target_makes_lk_nll_the_ce():
    logits = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.0, 0.0, 4.0, -1.0]])
    logp = torch.log_softmax(logits, -1)
    for kind in ("kl", "tv", "lk_hybrid", "lk_nll"):
        assert depth_loss(kind, logits, None, logp).abs().item() < 1e-6, kind
    labels = torch.tensor([3, 1])
    one_hot = torch.log(F.one_hot(labels, 4).float())       # 0 at the label, -inf elsewhere
    torch.testing.assert_close(lk_nll_loss(logits, one_hot), F.cross_entropy(logits, labels), **TOL)
    torch.testing.assert_close(kl_loss(logits, one_hot), F.cross_entropy(logits, labels), **TOL)


def test_temperature_divides_both_sides_logits():
    target_logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    draft = torch.tensor([[0.0, 1.0, 0.5, 0.0]])
    T = 2.0
    p, q = torch.softmax(target_logits / T, -1), torch.softmax(draft / T, -1)
    logp = target_log_probs(target_logits, T)
    torch.testing.assert_close(acceptance(draft, logp, T), torch.minimum(p, q).sum(-1), **TOL)
    torch.testing.assert_close(kl_loss(draft, logp, T), (p * (p.log() - q.log())).sum(), **TOL)


def test_lk_hybrid_weight_carries_no_gradient():
    """d/dz of lambda*KL + (1-lambda)*TV with lambda held at exp(-eta*alpha): the paper's sg[alpha]."""
    z = torch.tensor([[0.3, -0.2, 1.0, 0.0]], requires_grad=True)
    lk_hybrid_loss(z, LOG_P, eta=3.0).backward()
    with torch.no_grad():
        lam = math.exp(-3.0 * acceptance(z, LOG_P).item())
    z2 = z.detach().clone().requires_grad_(True)
    (lam * kl_loss(z2, LOG_P) + (1 - lam) * tv_loss(z2, LOG_P)).backward()
    torch.testing.assert_close(z.grad, z2.grad, **TOL)


def test_unknown_loss_and_bad_temperature_are_one_line_naming_the_key():
    with pytest.raises(ValueError, match="train.mtp_loss='js': use one of ce, kl, tv, lk_hybrid, lk_nll"):
        depth_loss("js", Q_LOGITS, torch.tensor([0]), LOG_P)
    base = dataclasses.asdict(TrainConfig())

    def bad(**kw):
        return OmegaConf.create({**base, **kw})
    with pytest.raises(ValueError, match="train.mtp_loss"):
        schema.check("train", bad(mtp_loss="js"))
    with pytest.raises(ValueError, match=r"train.mtp_loss_temperature=0: must be a temperature > 0"):
        schema.check("train", bad(mtp_loss_temperature=0))
    with pytest.raises(ValueError, match=r"train.lk_loss_eta=-1: must be a number >= 0"):
        schema.check("train", bad(lk_loss_eta=-1))


@pytest.mark.parametrize("kind", ["kl", "lk_hybrid"])
def test_objective_scores_each_depth_against_the_targets_distribution_of_that_token(kind):
    """Depth k at j is scored against softmax(lm_head(h_{j+k}) / T), the target's distribution for
    x_{j+k+1}, with the step weights; a top-k teacher with K = V gives the same loss."""
    model, ids = _model(2), _ids()
    opts = LossOptions(mtp_loss=kind, temperature=1.5, lk_eta=2.0)
    with torch.no_grad():
        loss, parts = mtp_objective(model, ids, mtp_loss_weight=0.3, mtp_loss_decay=0.5, train_base=False,
                                    options=opts)
        h = model.model(ids)
        logp = target_log_probs(model.lm_head(h), 1.5)                    # [B, T, V]
        want = 0.0
        for k, a in enumerate(model.mtp_chain(ids, h, 2), start=1):
            draft = model.draft_logits(k - 1, a[:, :-1]).flatten(0, 1)
            term = depth_loss(kind, draft, None, logp[:, k:-1].flatten(0, 1), 1.5, 2.0)
            assert parts[f"mtp{k}"] == pytest.approx(term.item(), rel=1e-6)
            want = want + 0.3 * 0.5 ** (k - 1) * term
        torch.testing.assert_close(loss, want, rtol=1e-6, atol=0)
        full = torch.log_softmax(model.lm_head(h).float(), -1)
        topk = full.topk(full.shape[-1], -1)
        loss_k, _ = mtp_objective(model, ids, mtp_loss_weight=0.3, mtp_loss_decay=0.5, train_base=False,
                                  options=opts, hidden=h, topk=(topk.values, topk.indices))
        torch.testing.assert_close(loss_k, loss, rtol=1e-5, atol=0)


@pytest.mark.parametrize("kind", ["kl", "tv", "lk_hybrid", "lk_nll"])
def test_a_top_k_target_gives_the_dense_losses_and_gradients(kind):
    """Shards hold the target's top-k: the TopK path (sums over the K tokens) equals the dense path
    over [N, V] with p = 0 (log p = -inf) outside them, value and gradient (float32, 1e-6)."""
    g = torch.Generator().manual_seed(0)
    n, v, k, t = 6, 32, 5, 0.7
    z = torch.randn(n, v, generator=g) * 2
    top = torch.randn(n, v, generator=g).topk(k, dim=-1)
    vals = F.log_softmax(top.values / t, dim=-1)
    dense = torch.full((n, v), float("-inf")).scatter(-1, top.indices, vals)
    a, b = z.clone().requires_grad_(), z.clone().requires_grad_()
    dense_loss = depth_loss(kind, a, None, dense, t)
    topk_loss = depth_loss(kind, b, None, TopK(vals, top.indices), t)
    dense_loss.backward()
    topk_loss.backward()
    torch.testing.assert_close(topk_loss, dense_loss, **TOL)
    torch.testing.assert_close(b.grad, a.grad, **TOL)
