"""The main job through Hydra (in-process compose): eval writes metrics.json with exactly the
documented keys, outputs.jsonl and the PNG; bad input gives one clear error line (exit code 2)."""
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from mtpx import LLM, SamplingParams
from mtpx.cli import run
from mtpx.evaluate import run_eval
from mtpx.train.checkpoint import save_checkpoint
from mtpx.train.tokenizer import train_tokenizer
from tests.conftest import peaked_model, tiny_config

CONF = str(Path(__file__).resolve().parents[1] / "conf")
METRIC_KEYS = {"num_requests", "num_failed", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
               "acceptance_rate", "acceptance_length", "per_position_acceptance", "output_throughput",
               "mean_ttft_ms", "mean_tpot_ms", "duration_s", "lossless_mismatches"}


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """A tiny random checkpoint folder with a real byte-level BPE tokenizer (vocab 300)."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    tok = train_tokenizer(["def f(x):\n    return x + 1\n" * 50, "Question: what?\nAnswer: 42\n" * 50], 300)
    model = peaked_model(tiny_config(vocab_size=tok.get_vocab_size(), max_position_embeddings=1024)).float()
    save_checkpoint(path, model, tok)
    return path


def _cfg(overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=overrides)


def test_eval_writes_metrics_outputs_and_plot(tiny_ckpt, tmp_path):
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=4",
                "eval.num_prompts=5", "eval.max_tokens=12", "logger=none", "eval.concurrency=3"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert METRIC_KEYS <= set(metrics) and set(metrics) - METRIC_KEYS <= {"lossless_near_ties",
                                                                         "plain_output_throughput"}
    assert metrics["num_requests"] == 5 and metrics["num_failed"] == 0
    assert metrics["lossless_mismatches"] == 0
    assert len(metrics["per_position_acceptance"]) == 4
    assert metrics["num_draft_tokens"] > 0
    rows = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(5))
    assert all(set(r) >= {"index", "output_token_ids", "text", "finish_reason"} for r in rows)
    assert (tmp_path / "per_position_acceptance.png").read_bytes()[:4] == b"\x89PNG"


def test_gsm8k_eval_scores_accuracy(tiny_ckpt, tmp_path):
    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2\\n#### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    cfg = _cfg([f"model.path={tiny_ckpt}", "data=gsm8k", f"data.path={data}", "eval.num_prompts=2",
                "eval.max_tokens=4", "logger=none"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["accuracy"] == 0.0 and metrics["num_correct"] == 0
    assert metrics["lossless_mismatches"] is None


@pytest.mark.parametrize("overrides,message", [
    (["+spec=mtp8", "spec.num_speculative_tokens=9"], "only 4 MTP modules"),
    (["+spec=mtp8", "spec.method=eagle"], "unknown spec 'eagle'"),
    (["data.name=squad"], "unknown data set 'squad'"),
    (["data=gsm8k", "data.path=/nonexistent/test.jsonl"], "data.path="),
    (["mode=serve"], "unknown mode 'serve'"),
])
def test_bad_input_one_clear_line(tiny_ckpt, overrides, message, capsys):
    cfg = _cfg([f"model.path={tiny_ckpt}", "logger=none", "eval.num_prompts=2"] + overrides)
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_malformed_data_file_names_file_and_line(tiny_ckpt, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    cfg = _cfg([f"model.path={tiny_ckpt}", "logger=none", "data=gsm8k", f"data.path={data}"])
    assert run(cfg) == 2
    assert f"{data}:2" in capsys.readouterr().err


def test_missing_checkpoint_names_the_fix(tmp_path, capsys):
    cfg = _cfg([f"model.path={tmp_path / 'nope'}", "logger=none"])
    assert run(cfg) == 2
    assert "model.path" in capsys.readouterr().err


def test_bad_prompts_fail_alone(tiny_ckpt):
    llm = LLM(model=tiny_ckpt, spec="mtp1", max_model_len=64)
    outs = llm.generate(["", "x" * 500, "def f(x):"], SamplingParams(max_tokens=5))
    assert outs[0].error.startswith("empty prompt") and outs[0].finish_reason is None
    assert "maximum length is 64" in outs[1].error
    assert outs[2].error is None and outs[2].finish_reason in ("stop", "length")
    assert len(outs[2].output_token_ids) >= 1


def test_generate_api_with_token_ids_and_strings(tiny_ckpt):
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2)
    ids = llm.encode("def f(x):")
    a, b = llm.generate(["def f(x):", ids], SamplingParams(max_tokens=6, ignore_eos=True))
    assert a.output_token_ids == b.output_token_ids and len(a.output_token_ids) == 6
    assert a.finish_reason == "length" and a.text == llm.decode(a.output_token_ids)
    assert a.spec.num_drafts >= 1 and a.prompt_token_ids == ids


@pytest.mark.parametrize("kwargs,message", [({"max_num_seqs": 0}, "max_num_seqs=0"),
                                            ({"max_model_len": 5000}, "max_model_len=5000"),
                                            ({"spec": "mtp8", "num_speculative_tokens": 0}, ">= 1")])
def test_llm_rejects_bad_engine_settings(tiny_ckpt, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(model=tiny_ckpt, **kwargs)


def test_unknown_config_group_option_is_one_line():
    from mtpx.cli import check_group_overrides
    conf = Path(CONF)
    assert check_group_overrides(["+spec=mtp8", "data=gsm8k", "eval.max_tokens=3"], conf) is None
    assert check_group_overrides(["+spec=mtp9"], conf) == \
        "unknown spec 'mtp9': choose one of mtp1, mtp8 (+spec=NAME)"
    assert "unknown data set 'squad'" in check_group_overrides(["data=squad"], conf)
    assert "'mtp3'" in check_group_overrides(["-m", "+spec=mtp1,mtp3"], conf)
    assert "'+spec=mtp8'" in check_group_overrides(["spec=mtp8"], conf)
    assert "+spec=mtp1 or +spec=mtp8" in check_group_overrides(["spec.num_speculative_tokens=3"], conf)
    assert check_group_overrides(["+spec=mtp8", "spec.num_speculative_tokens=3"], conf) is None
