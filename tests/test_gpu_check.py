"""tools/gpu_check.py runs on a CPU: the GPU-only comparisons say why they are skipped, and the
timing table is complete."""
import importlib.util
import json
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"


def test_gpu_check_cpu_smoke(tiny_ckpt, tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--device", "cpu", "--quick", "--model", str(tiny_ckpt), "--out", str(tmp_path),
                      "--compile-backend", "eager"]) == 0
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert ("skipped" in r["attention"] and "skipped" in r["gated_delta_rule"]
            and "skipped" in r["engine_tokens"])
    assert "CUDA" in r["engine_tokens"]["skipped"]
    assert r["tensor_parallel"]["skipped"].startswith("tensor parallelism over NCCL needs CUDA devices")
    t = r["timing"]
    assert ([(c["k"], c["batch_size"]) for c in t["step_costs"]]
            == [(0, 1), (0, 4), (1, 1), (1, 4), (2, 1), (2, 4)])
    assert set(t["output_tokens_per_s"]) == {"plain@1", "mtp8@1", "plain@4", "mtp8@4"}
    assert t["decode_over_floor"] > 1
    c = r["compiled"]
    assert c["ok"] and [(x["spec"], x["batch_size"]) for x in c["rows"]] == [
        ("plain", 1), ("plain", 4), ("mtp8", 1), ("mtp8", 4)]
    assert all(x["tokens_identical"] and x["compiled_step_ms"] > 0 for x in c["rows"])
    assert c["compile_mtp8"]["num_graphs"] == 3
    tr = r["training"]       # the device is the CPU here: the same step twice, bit-identical
    assert tr["ok"] and tr["batch"] == [2, 64]
    assert all(tr[n]["loss_rel_diff"] == 0 and tr[n]["max_weight_diff"] == 0
               for n in ("joint", "frozen_target"))
    assert set(tr["train_tokens_per_s"]) == {"float32", "bfloat16_autocast"}
    assert all(v > 0 for v in tr["train_tokens_per_s"].values())
    ref = r["reference"]     # section 8: GSM8K at concurrency 4 here (64 on a GPU), when the data is there
    if "skipped" not in ref:
        assert set(ref["rows"]) == {"plain", "mtp1", "mtp8", "auto"} and ref["concurrency"] == 4
        assert (ref["rows"]["plain"]["differing_from_plain"] == 0
                and all(x["tok_s"] > 0 for x in ref["rows"].values()))
        assert ref["mtp8_over_plain"] == ref["rows"]["mtp8"]["tok_s"] / ref["rows"]["plain"]["tok_s"]
    else:
        assert "GSM8K" in ref["skipped"]
    assert (tmp_path / "gpu_check.md").read_text().startswith("# mtpx GPU check (cpu, float32")
