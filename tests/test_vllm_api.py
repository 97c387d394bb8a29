"""vLLM's API shape: outputs[0].text / token_ids / finish_reason / stop_reason,
generate(prompts, sampling_params=...), stop strings, speculative_config, accepted_per_position
of length k."""
import pytest

from mtpx import LLM, CompletionOutput, SamplingParams


def test_outputs_in_vllm_shape(tiny_ckpt):
    llm = LLM(model=tiny_ckpt, speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    assert llm.spec == "mtp8" and llm.num_speculative_tokens == 3
    (o,) = llm.generate(["def f(x):"], sampling_params=SamplingParams(max_tokens=5, ignore_eos=True))
    c = o.outputs[0]
    assert isinstance(c, CompletionOutput) and len(o.outputs) == 1
    assert ((c.text, c.token_ids, c.finish_reason, c.stop_reason)
            == (o.text, o.output_token_ids, "length", None))
    assert o.prompt == "def f(x):" and o.request_id == "0" and o.finished
    assert len(o.spec.accepted_per_position) == 3     # one entry per draft position, accepted or not


def test_speculative_config_errors_name_the_key(tiny_ckpt):
    with pytest.raises(ValueError,
                       match="unknown speculative_config key 'num_speculative_token': did you mean "
                             "'num_speculative_tokens'"):
        LLM(model=tiny_ckpt, speculative_config={"method": "mtp", "num_speculative_token": 2})
    with pytest.raises(ValueError, match="method 'eagle'"):
        LLM(model=tiny_ckpt, speculative_config={"method": "eagle"})
    with pytest.raises(ValueError, match="not both"):
        LLM(model=tiny_ckpt, spec="mtp1", speculative_config={"method": "mtp"})
    assert (LLM(model=tiny_ckpt, speculative_config={"method": "mtp1", "num_speculative_tokens": 2}).spec
            == "mtp1")


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp1", 3), ("mtp8", 4)])
def test_stop_strings_end_where_plain_decoding_does(tiny_ckpt, spec, k):
    """The text is cut before the first stop string and the token ids keep the token that
    completed it; speculative decoding stops at the same token as plain decoding."""
    plain = LLM(model=tiny_ckpt)
    prompt = "def f(x):"
    free = plain.generate([prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    ids, text = free.output_token_ids, free.text
    # a stop string that starts inside the output and spans a token boundary
    pieces = [plain.decode(ids[:i]) for i in range(len(ids) + 1)]
    j = next(i for i in range(4, len(ids))
             if len(pieces[i + 1]) - len(pieces[i]) >= 1 and len(pieces[i]) >= 2)
    stop = text[len(pieces[j]) - 1: len(pieces[j]) + 1]
    first = text.find(stop)
    llm = LLM(model=tiny_ckpt, spec=spec, num_speculative_tokens=k)
    (o,) = llm.generate([prompt], SamplingParams(max_tokens=40, ignore_eos=True, stop=[stop, "never-there"]))
    assert o.finish_reason == "stop" and o.stop_reason == stop
    assert o.text == text[:first] and stop not in o.text
    end = next(i for i in range(len(ids) + 1) if stop in pieces[i])   # the first token that completes it
    assert o.output_token_ids == ids[:end]
    assert o.spec.num_committed_tokens == (len(o.output_token_ids) - 1 if spec else 0)


def test_stop_token_ids_report_their_id(tiny_ckpt):
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2)
    free = llm.generate(["def f(x):"], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    t = free.output_token_ids[5]
    (o,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=[t]))
    assert o.finish_reason == "stop" and o.stop_reason == t
    assert o.output_token_ids == free.output_token_ids[:free.output_token_ids.index(t) + 1]


def test_sampling_params_stop_and_n():
    assert SamplingParams(stop="###").stop == ["###"]
    with pytest.raises(ValueError, match="stop=.*non-empty strings"):
        SamplingParams(stop=[""])
    with pytest.raises(ValueError, match=r"n=0: must be an integer >= 1"):
        SamplingParams(n=0)


def test_n_completions_are_seeded_as_vllm_seeds_them(tiny_ckpt):
    """n > 1: completion j is what a lone request with seed + j generates; a bad prompt fails
    alone with all of its completions; greedy completions are identical."""
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2)
    sp = SamplingParams(max_tokens=8, temperature=1.0, seed=5, n=3, ignore_eos=True)
    o, bad = llm.generate(["def f(x):", ""], sp)
    assert [c.index for c in o.outputs] == [0, 1, 2] and o.output_token_ids == o.outputs[0].token_ids
    for j, c in enumerate(o.outputs):
        (alone,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=8, temperature=1.0, seed=5 + j,
                                                               ignore_eos=True))
        assert c.token_ids == alone.output_token_ids and c.spec.num_drafts == alone.spec.num_drafts
    assert len({tuple(c.token_ids) for c in o.outputs}) > 1
    assert bad.error is not None and bad.index == 1
    (g,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=6, n=2))
    assert g.outputs[0].token_ids == g.outputs[1].token_ids


@pytest.mark.parametrize("spec,k,temperature", [(None, None, 0.0), ("mtp8", 3, 0.0), ("mtp8", 3, 1.0)])
def test_logprobs_equal_a_from_scratch_forward(tiny_ckpt, spec, k, temperature):
    """SamplingParams(logprobs=N): each output token's log-probability and rank, and the top N,
    equal log_softmax of the target's logits from one forward over prompt + output (1e-4)."""
    import torch
    llm = LLM(model=tiny_ckpt, spec=spec, num_speculative_tokens=k)
    (o,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=10, ignore_eos=True, logprobs=3,
                                                      temperature=temperature, seed=3))
    c = o.outputs[0]
    ids = o.prompt_token_ids + o.output_token_ids
    with torch.inference_mode():
        ref = torch.log_softmax(llm.model(torch.tensor([ids])).float(), -1)[0]
    P = len(o.prompt_token_ids)
    assert len(c.logprobs) == len(c.token_ids) == 10
    for i, (t, entry) in enumerate(zip(c.token_ids, c.logprobs)):
        row = ref[P - 1 + i]
        assert abs(entry[t].logprob - row[t].item()) < 1e-4     # raw logits, before temperature
        assert entry[t].rank == int((row > row[t]).sum()) + 1 and (entry[t].rank == 1 or temperature > 0)
        top = row.topk(3)
        assert set(entry) == set(top.indices.tolist()) | {t}
        for j, tid in enumerate(top.indices.tolist()):
            assert abs(entry[tid].logprob - top.values[j].item()) < 1e-4
        assert entry[t].decoded_token == llm.decode([t])
    assert abs(c.cumulative_logprob - sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs))) < 1e-9
    (none,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=3))
    assert none.outputs[0].logprobs is None and none.outputs[0].cumulative_logprob is None
    with pytest.raises(ValueError, match=r"logprobs=21: must be an integer in \[0, 20\]"):
        SamplingParams(logprobs=21)


def test_prompt_logprobs_score_every_prompt_token(tiny_ckpt):
    """prompt_logprobs: x_i's log-probability given x_<i for every prompt token after the first,
    equal to one forward over the prompt; chunked prefill and a prefix-cache hit change nothing
    (a scoring request recomputes every position)."""
    import torch
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2, enable_prefix_caching=True,
              max_num_batched_tokens=16, block_size=4)
    prompt = "def f(x):\n    return x + 1\n" * 3
    sp = SamplingParams(max_tokens=1, prompt_logprobs=2)
    (warm,) = llm.generate([prompt], SamplingParams(max_tokens=1))     # fills the prefix cache
    (o,) = llm.generate([prompt], sp)
    ids = o.prompt_token_ids
    assert len(ids) > 16 and o.num_cached_tokens == 0                   # chunked, no cache hit
    with torch.inference_mode():
        ref = torch.log_softmax(llm.model(torch.tensor([ids])).float(), -1)[0]
    assert o.prompt_logprobs[0] is None and len(o.prompt_logprobs) == len(ids)
    for i in range(1, len(ids)):
        entry = o.prompt_logprobs[i]
        assert abs(entry[ids[i]].logprob - ref[i - 1, ids[i]].item()) < 1e-4
        assert entry[ids[i]].rank == int((ref[i - 1] > ref[i - 1, ids[i]]).sum()) + 1
        assert set(ref[i - 1].topk(2).indices.tolist()) <= set(entry)
    assert o.output_token_ids == warm.output_token_ids


def test_generate_takes_prompts_as_vllm_does(tiny_ckpt):
    """A single string, a single list of ids, {"prompt": ...}, {"prompt_token_ids": [...]} and a
    generator all generate what the equivalent list of strings / id lists does."""
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2)
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    (ref,) = llm.generate(["def f(x):"], sp)
    ids = ref.prompt_token_ids
    for prompts in ("def f(x):", {"prompt": "def f(x):"}, [{"prompt_token_ids": ids}], ids,
                    (p for p in ["def f(x):"]), [{"prompt": "def f(x):"}]):
        (o,) = llm.generate(prompts, sp)
        assert o.error is None and o.output_token_ids == ref.output_token_ids and o.text == ref.text
    (o,) = llm.generate({"prompt": "def f(x):"}, sp)
    assert o.prompt == "def f(x):"
    bad, good = llm.generate([{"prompt": "x", "multi_modal_data": {}}, {"prompt_token_ids": ids}], sp)
    assert "exactly one of 'prompt'" in bad.error and good.output_token_ids == ref.output_token_ids
    (bad,) = llm.generate([{"prompt_token_ids": "def"}], sp)
    assert "use 'prompt' for text" in bad.error
    assert llm.get_tokenizer() is llm.tokenizer and llm.get_tokenizer().encode("def f(x):").ids == ids


def test_use_tqdm_and_request_metrics(tiny_ckpt, capsys):
    llm = LLM(model=tiny_ckpt)
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = llm.generate(["a", "b", ""], sp, use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err and outs[2].error is not None
    made = []

    def bar(**kw):
        from tqdm import tqdm
        made.append(kw["total"])
        return tqdm(disable=True, **kw)
    llm.generate(["a"], sp, use_tqdm=bar)
    assert made == [1]
    m = outs[0].metrics
    assert m.arrival_time <= m.first_token_time <= m.last_token_time <= m.finished_time
    assert m.finished_time == outs[0].finish_time and m.time_in_queue is None
    with pytest.raises(ValueError, match="use_tqdm="):
        llm.generate(["a"], sp, use_tqdm="yes")


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp8", 3)])
def test_min_tokens_masks_eos_and_stop_ids(tiny_ckpt, spec, k):
    """min_tokens: the stop ids (EOS, stop_token_ids) cannot end a request before min_tokens
    output tokens, drafts included; after it the request stops at the first one, and the
    output equals plain decoding with those ids masked up to min_tokens."""
    llm = LLM(model=tiny_ckpt, spec=spec, num_speculative_tokens=k)
    free = llm.generate(["def f(x):"], SamplingParams(max_tokens=30, ignore_eos=True))[0].output_token_ids
    t = free[2]                                   # a token that occurs early
    (early,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=30, ignore_eos=True, stop_token_ids=[t]))
    assert early.output_token_ids == free[:3]
    (o,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=30, ignore_eos=True, stop_token_ids=[t],
                                                      min_tokens=10))
    assert t not in o.output_token_ids[:9] and len(o.output_token_ids) >= 10
    assert o.finish_reason == "length" or o.output_token_ids[-1] == t
    plain = LLM(model=tiny_ckpt).generate(["def f(x):"], SamplingParams(max_tokens=30, ignore_eos=True,
                                                                        stop_token_ids=[t],
                                                                        min_tokens=10))[0]
    assert o.output_token_ids == plain.output_token_ids
    for s in (0, 30):
        SamplingParams(max_tokens=30, min_tokens=s)
    with pytest.raises(ValueError, match=r"min_tokens=31: must be an integer in \[0, max_tokens=30\]"):
        SamplingParams(max_tokens=30, min_tokens=31)


def test_include_stop_str_in_output(tiny_ckpt):
    llm = LLM(model=tiny_ckpt)
    text = llm.generate(["def f(x):"], SamplingParams(max_tokens=30, ignore_eos=True))[0].text
    stop = text[5:7]
    first = text.find(stop)
    (cut,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=30, ignore_eos=True, stop=stop))
    (kept,) = llm.generate(["def f(x):"], SamplingParams(max_tokens=30, ignore_eos=True, stop=stop,
                                                         include_stop_str_in_output=True))
    assert cut.text == text[:first] and kept.text == text[:first + 2]
    assert kept.output_token_ids == cut.output_token_ids


def test_sampling_params_name_the_field_of_a_wrong_type():
    with pytest.raises(ValueError, match=r"^temperature='0.5': must be a number, not str"):
        SamplingParams(temperature="0.5")
    with pytest.raises(ValueError, match=r"^top_p=None: must be a number"):
        SamplingParams(top_p=None)
    with pytest.raises(ValueError, match=r"^presence_penalty='0.5': must be a number"):
        SamplingParams(presence_penalty="0.5")
    SamplingParams(temperature=1, presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.2)


def test_vllm_method_names_dtype_auto_and_bad_k(tiny_ckpt):
    import torch
    for method in ("deepseek_mtp", "qwen3_next_mtp", "mimo_mtp"):
        llm = LLM(model=tiny_ckpt, speculative_config={"method": method, "num_speculative_tokens": 2})
        assert llm.spec == "mtp8" and llm.num_speculative_tokens == 2
    assert next(LLM(model=tiny_ckpt, dtype="auto").model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match=r"num_speculative_tokens=2.5: give an integer"):
        LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2.5)


def test_checkpoint_dtype_reads_config_then_weights(tmp_path):
    import json

    import torch
    from safetensors.torch import save_file

    from mtpx.hf.loader import checkpoint_dtype
    save_file({"w": torch.zeros(2, dtype=torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_dtype(tmp_path) == torch.bfloat16
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert checkpoint_dtype(tmp_path) == torch.float16


def test_hub_id_says_nothing_is_downloaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError,
                       match="mtpx loads local checkpoint folders only and downloads nothing"):
        LLM(model="Qwen/Qwen3-Next-80B-A3B-Instruct")


def test_max_tokens_past_max_model_len_warns(tiny_ckpt):
    llm = LLM(model=tiny_ckpt, max_model_len=64)
    with pytest.warns(UserWarning,
                      match=r"max_tokens=1000000 with prompt 0's \d+ tokens exceeds max_model_len=64"):
        (o,) = llm.generate("def f(x):", SamplingParams(max_tokens=10**6, ignore_eos=True))
    assert o.finish_reason == "length" and len(o.prompt_token_ids) + len(o.output_token_ids) == 64


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_chat_renders_with_the_chat_template_as_vllm_does(tiny_ckpt, tmp_path):
    """LLM.chat: one conversation or a list of them, rendered by the folder's chat template
    (chat_template.jinja) or the chat_template argument, encoded without special tokens, and
    generated as generate() would the rendered ids; prompt is the rendered text."""
    import shutil
    folder = tmp_path / "chat"
    shutil.copytree(tiny_ckpt, folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    llm = LLM(model=folder, spec="mtp8", num_speculative_tokens=2)
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]
    rendered = "<|system|>be brief\n<|user|>def f(x):\n<|assistant|>"
    (ref,) = llm.generate({"prompt_token_ids":
                           llm.get_tokenizer().encode(rendered, add_special_tokens=False).ids}, sp)
    (one,) = llm.chat(conv, sp)
    two = llm.chat([conv, [{"role": "user", "content": "x"}]], sp, use_tqdm=False)
    assert one.prompt == rendered and one.output_token_ids == ref.output_token_ids and one.error is None
    assert [o.prompt for o in two] == [rendered, "<|user|>x\n<|assistant|>"]
    assert two[0].output_token_ids == ref.output_token_ids
    (cont,) = llm.chat(conv + [{"role": "assistant", "content": "ret"}], sp, add_generation_prompt=False,
                       continue_final_message=True)
    assert cont.prompt == rendered + "ret"
    (other,) = LLM(model=tiny_ckpt).chat(conv, sp, chat_template="{{ messages[-1].content }}")
    assert other.prompt == "def f(x):"


def test_chat_errors_are_one_line(tiny_ckpt):
    llm = LLM(model=tiny_ckpt)
    conv = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match=r"has no chat template: .* or pass chat_template=<jinja source>"):
        llm.chat(conv)
    with pytest.raises(ValueError, match=r"^messages has type str: give a conversation"):
        llm.chat("hi", chat_template=CHAT_TEMPLATE)
    with pytest.raises(ValueError, match=r"^conversation 1 must be a non-empty list of"):
        llm.chat([conv, []], chat_template=CHAT_TEMPLATE)
    with pytest.raises(ValueError, match=r"^messages: the chat template failed: .*no roles"):
        llm.chat(conv, chat_template="{{ raise_exception('no roles') }}")
    with pytest.raises(ValueError, match="set add_generation_prompt=False"):
        llm.chat(conv, chat_template=CHAT_TEMPLATE, continue_final_message=True)


@pytest.fixture(scope="module")
def demo_plain():
    from mtpx.engine.llm import DEFAULT_MODEL
    from tests.test_demo_checkpoint import PROMPTS
    llm = LLM(model=DEFAULT_MODEL, dtype="float64")
    free = [o.output_token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=40))]
    bias = {free[0][3]: -100.0, free[2][5]: 2.0}
    sp = ([SamplingParams(max_tokens=40, repetition_penalty=1.5, logit_bias=bias)] * 3
          + [SamplingParams(max_tokens=40, frequency_penalty=2.0, presence_penalty=0.1)] * 2)
    return llm, PROMPTS, sp, free, [o.output_token_ids for o in llm.generate(PROMPTS, sp)]


@pytest.mark.parametrize("spec,k", [("mtp1", 3), pytest.param("mtp8", 8, marks=pytest.mark.slow),
                                    # slow: 26 and 55 s
                                    pytest.param("mtp8", "auto", marks=pytest.mark.slow)])
def test_penalties_and_logit_bias_with_speculation_equal_plain_decoding(demo_plain, spec, k, monkeypatch):
    """Greedy output with penalties and logit_bias: speculation commits exactly what plain decoding
    does (each window position is penalized with the drafts before it counted), with drafts
    accepted; processing every window position with the committed output only (the bug class of
    SGLang PR #33643) would not."""
    import torch
    import mtpx.engine.model_runner as model_runner
    base, prompts, sp, free, expected = demo_plain
    assert expected != free                                   # the penalties change the output
    assert all(t not in o for t, b in sp[0].logit_bias.items() if b < 0 for o in expected[:3])
    llm = LLM(model=base.model, tokenizer=base.tokenizer, spec=spec, num_speculative_tokens=k)
    outs = llm.generate(prompts, sp)
    assert [o.output_token_ids for o in outs] == expected
    assert sum(o.spec.num_accepted_tokens for o in outs) > 20
    if k == 8:
        right = model_runner.process_logits

        def stale(reqs, logits, ids=None):     # every column sees the committed output only
            if ids is None:
                return right(reqs, logits)
            return torch.cat([right(reqs, logits[:, j:j + 1], ids[:, :1]) for j in range(logits.shape[1])], 1)
        monkeypatch.setattr(model_runner, "process_logits", stale)
        wrong = LLM(model=base.model, tokenizer=base.tokenizer, spec=spec, num_speculative_tokens=k)
        assert [o.output_token_ids for o in wrong.generate(prompts, sp)] != expected


def test_penalties_follow_vllms_formulas(tiny_ckpt):
    """One step by hand: the first output token is the argmax of the processed logits (repetition
    over the prompt; frequency/presence over no output yet), and bad values name the field."""
    import torch
    from mtpx.engine.logits import process_logits
    from mtpx.core.request import Request
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.9, 0.0]], dtype=torch.float64)
    r = Request(0, [0, 1],
                SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                               logit_bias={4: 0.75}))
    r.output_token_ids = [2, 2, 3]
    out = process_logits([r], logits)
    # 0: prompt, 2 / 2 = 1; 1: prompt, -1 * 2 = -2; 2: output twice: 0.5 / 2 - 2 * 0.5 - 0.25;
    # 3: output once: 1.9 / 2 - 0.5 - 0.25; 4: bias only
    assert out.tolist() == [[1.0, -2.0, 0.25 - 1.0 - 0.25, 0.95 - 0.5 - 0.25, 0.75]]
    window = torch.zeros(1, 3, 5)
    ids = torch.tensor([[3, 4, 4]])                           # x_n, d_1 = 4, d_2 = 4
    r2 = Request(0, [0], SamplingParams(frequency_penalty=1.0))
    r2.output_token_ids = [3]
    assert process_logits([r2], window, ids)[0, :, 4].tolist() == [0.0, -1.0, -2.0]
    for kw, msg in (({"presence_penalty": 2.5}, r"presence_penalty=2.5: must be in \[-2, 2\]"),
                    ({"repetition_penalty": 0}, r"repetition_penalty=0: must be > 0"),
                    ({"logit_bias": {"a": 1}}, "logit_bias=")):
        with pytest.raises(ValueError, match=msg):
            SamplingParams(**kw)
    (o,) = LLM(model=tiny_ckpt).generate(["x"], SamplingParams(max_tokens=2, logit_bias={10**6: 1.0}))
    assert o.error.startswith("logit_bias token ids [1000000] are outside the vocabulary [0, ")
