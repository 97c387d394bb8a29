"""End to end: train MTP heads in mtpx for a standard Hugging Face Llama folder (frozen target),
export them as a draft file, and serve them with the unchanged folder through spec.draft_path."""
import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mtpx import LLM, SamplingParams
from mtpx.hf.export import export_checkpoint
from mtpx.hf.loader import load_pretrained
from mtpx.train.loop import train
from tests.test_train import TINY_MODEL, run_cfg, write_synthetic_gsm8k

LLAMA_MODEL = dict(TINY_MODEL, model_type="llama", layer_types=["full_attention"] * 2,
                   attn_output_gate=False, use_qk_norm=False, rms_norm_unit_offset=False,
                   partial_rotary_factor=1.0)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _hf_style_tokenizer(folder, texts, vocab_size):
    """A tokenizer like a Hugging Face model's: ChatML specials (no mtpx <|pad|>), eos <|im_end|>,
    a chat template in tokenizer_config.json."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML}))


@pytest.mark.parametrize("tokenizer", ["mtpx", "hf_style"])
def test_heads_trained_for_a_llama_folder_serve_it_losslessly(tmp_path, tokenizer):
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl")
    # a Llama target (trained briefly so its outputs are not noise), exported as a plain HF folder
    cfg = run_cfg(tmp_path, "target", steps=40, eval_every=0)
    cfg["model"] = dict(LLAMA_MODEL, num_nextn_predict_layers=0)
    target_ckpt = train(cfg)
    hf = export_checkpoint(target_ckpt, tmp_path / "llama_hf", None, target_only=True)
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "num_nextn_predict_layers" not in config
    if tokenizer == "hf_style":  # the folder's tokenizer is a Hugging Face one, not mtpx's
        texts = [json.loads(line)["question"] for line in (tmp_path / "gsm8k.jsonl").read_text().splitlines()]
        _hf_style_tokenizer(hf, texts, 300)

    # train 2 MTP heads on the frozen HF target, export them as a draft file
    cfg = run_cfg(tmp_path, "heads", steps=40, eval_every=0, freeze_base=True)
    cfg["model"] = dict(LLAMA_MODEL, num_nextn_predict_layers=2, path=str(hf))
    heads_ckpt = train(cfg)
    cfg["train"]["steps"] = 44                   # resuming the heads run reads its checkpoint back
    heads_ckpt = train(cfg)
    head = export_checkpoint(heads_ckpt, tmp_path / "head.safetensors", "draft")
    if tokenizer == "hf_style":  # the checkpoint kept the model's tokenizer, chat template included
        _, tok = load_pretrained(heads_ckpt)
        assert tok.eos_token_ids == [1]
        assert (tok.apply_chat_template([{"role": "user", "content": "hi"}])
                == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")

    base, _ = load_pretrained(hf, dtype=torch.float64)
    served, tok = load_pretrained(hf, dtype=torch.float64, draft_path=head)
    x = torch.randint(0, base.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the target is the folder's, untouched by head training
        torch.testing.assert_close(served(x), base(x), rtol=0, atol=0)

    prompts = [f"Tom has {a} apples and buys {b} more." for a, b in [(3, 4), (12, 30), (7, 7), (41, 2)]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = LLM(model=base, tokenizer=tok).generate(prompts, params)
    spec = LLM(model=served, tokenizer=tok, spec="mtp8").generate(prompts, params)
    assert [o.output_token_ids for o in spec] == [o.output_token_ids for o in plain]
    if tokenizer == "mtpx":  # the target was trained on these token ids: its heads learn to draft
        assert sum(o.spec.num_accepted_tokens for o in spec) > 0

    # the same through the folder path and spec.draft_path, as `model=hf spec.draft_path=` does
    llm = LLM(model=str(hf), spec="mtp8", draft_path=head, dtype="float64")
    assert [o.output_token_ids for o in llm.generate(prompts, params)] == [o.output_token_ids for o in plain]
