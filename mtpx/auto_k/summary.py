"""What automatic k reports (metrics.json's auto_k): a mixin of AutoDraftLength
(mtpx/auto_k/policy.py), whose state it reads; it owns none."""
from __future__ import annotations

from mtpx.auto_k.cost_model_log import bucket_label

__all__ = ["AutoSummary"]


class AutoSummary:
    """`summary`: the policy's decisions, estimates and costs, for metrics.json."""

    def summary(self) -> dict:
        """For metrics.json: the histograms of k per step and depth per request, the estimates,
        the costs and their corrections, and the predicted-vs-measured log (cost_model)."""
        return {"k_histogram": {str(k): n for k, n in sorted(self.histogram.items())},
                "depth_histogram": {str(d): n for d, n in sorted(self.depth_histogram.items())},
                "per_request": self.per_request,
                "verified_histogram": {str(d): n for d, n in sorted(self.verified_histogram.items())},
                "conditional_acceptance": [round(p, 4) for p in self.acceptance],
                "num_observed": list(self.num_observed),
                "acceptance_by_age": self.estimates.summary(),
                "age_mix": [round(m, 4) for m in self.age_mix] if self.age_mix else None,
                "cost_correction": {str(k): round(c.value, 3) for k, c in sorted(self.correction.items())},
                "cost_factor": round(self.factor, 3),
                "explore_spent": round(self.explore_spent(), 4),
                "prefill_module_ms_per_token": (round(self.prefill_module_ms.value, 5)
                                                if self.prefill_module_ms.count else None),
                "step_overhead_ms": [{"batch_bucket": bucket_label(b), "ms": round(m.value, 3), "steps": m.count}
                                     for b, m in sorted(self.overhead.items())],
                "bucket_cost_correction": [{"k": k, "batch_bucket": bucket_label(b), "ratio": round(r.value, 4),
                                            "steps": r.count} for (k, b), r in sorted(self.bucket_correction.items())],
                "part_cost_correction": [{"part": p, "k": k, "batch_bucket": bucket_label(b), "ratio": round(r.value, 4),
                                          "steps": r.count} for (p, k, b), r in sorted(self.part_correction.items())],
                "cost_model": self.cost_log.summary(),
                "step_costs_ms": [{"k": k, "batch_size": b, "step_ms": round(ms, 4)}
                                  for (k, b), ms in sorted(self.step_costs.items())] if self.step_costs else None}
