"""What automatic k reports (metrics.json's auto_k): `summary` reads an AutoDraftLength's state
(policy.py) and its parts'; it owns none."""
from __future__ import annotations

from mtpx.auto_k.cost_model_log import bucket_label

__all__ = ["summary"]


def summary(policy) -> dict:
    """For metrics.json: the histograms of k per step and depth per request, the estimates,
    the costs and their corrections, and the predicted-vs-measured log (cost_model)."""
    return {"k_histogram": {str(k): n for k, n in sorted(policy.histogram.items())},
            "depth_histogram": {str(d): n for d, n in sorted(policy.depth_histogram.items())},
            "per_request": policy.per_request,
            "verified_histogram": {str(d): n
                                   for d, n in sorted(policy.per_request_k.verified_histogram.items())},
            "conditional_acceptance": [round(p, 4) for p in policy.acceptance],
            "num_observed": list(policy.num_observed),
            "acceptance_by_age": policy.estimates.summary(),
            "age_mix": [round(m, 4) for m in policy.age_mix] if policy.age_mix else None,
            "cost_correction": {str(k): round(c.value, 3)
                                for k, c in sorted(policy.costs.correction.items())},
            "cost_factor": round(policy.costs.factor, 3),
            "explore_spent": round(policy.exploring.spent(), 4),
            "prefill_module_ms_per_token": (round(policy.costs.prefill_module_ms.value, 5)
                                            if policy.costs.prefill_module_ms.count else None),
            "step_overhead_ms": [{"batch_bucket": bucket_label(b), "ms": round(m.value, 3), "steps": m.count}
                                 for b, m in sorted(policy.costs.overhead.items())],
            "bucket_cost_correction": [{"k": k, "batch_bucket": bucket_label(b), "ratio": round(r.value, 4),
                                        "steps": r.count}
                                       for (k, b), r in sorted(policy.costs.bucket_correction.items())],
            "part_cost_correction": [{"part": p, "k": k, "batch_bucket": bucket_label(b),
                                      "ratio": round(r.value, 4), "steps": r.count}
                                     for (p, k, b), r in sorted(policy.costs.part_correction.items())],
            "cost_model": policy.costs.cost_log.summary(),
            "catch_up_module_ms_per_token": (round(policy.costs.catch_up_module_ms.value, 5)
                                             if policy.costs.catch_up_module_ms.count else None),
            "run_estimate": policy.costs.run_estimate(policy.expected_tokens),
            "step_costs_ms": ([{"k": k, "batch_size": b, "step_ms": round(ms, 4)}
                               for (k, b), ms in sorted(policy.step_costs.items())]
                              if policy.step_costs else None)}
