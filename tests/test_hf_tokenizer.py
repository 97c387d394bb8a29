"""mtpx.hf.tokenizer: Hugging Face tokenizer folders and chat-template rendering
(parity with transformers)."""
import json
from datetime import datetime

import pytest
from jinja2.exceptions import SecurityError, TemplateError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mtpx.hf.tokenizer import HFTokenizer, load_hf_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2

# Qwen-style ChatML. Written with plain {% %} tags on their own lines, so the output is only right
# with trim_blocks + lstrip_blocks; tools go through transformers' tojson (no HTML escaping, non-ASCII kept).
CHATML = """{% if tools %}
<|im_start|>system
# Tools
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|im_end|>
{% endif %}
{% for message in messages %}
{% if loop.first and message['role'] != 'system' %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% if message.tool_calls is defined %}(tool_calls){% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}
<think>

</think>

{% endif %}
{% endif %}"""

CHAT = [{"role": "user", "content": "Hello there, how are you?"},
        {"role": "assistant", "content": "I am fine.", "tool_calls": None}]
RENDERED = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello there, how are you?<|im_end|>\n"
            "<|im_start|>assistant\nI am fine.<|im_end|>\n")
GEN_PROMPT = "<|im_start|>assistant\n"
TOOLS = [{"name": "météo", "description": "a<b & 'c'", "parameters": {"type": "object"}}]
ADDED_PAD = {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": False, "normalized": False,
             "rstrip": False, "single_word": False, "special": True}


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Hello there, how are you?", "I am fine.", "You are a helpful assistant."] * 4,
                            trainer=trainer)
    return tok


def make_folder(path, config=None, generation=None, jinja=None):
    """A checkpoint folder: tokenizer.json + tokenizer_config.json (+ generation_config.json,
    chat_template.jinja)."""
    path.mkdir(parents=True, exist_ok=True)
    _tokenizer().save(str(path / "tokenizer.json"))
    config = ({"eos_token": "<|im_end|>", "pad_token": ADDED_PAD, "chat_template": CHATML} if config is None
              else config)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    if jinja is not None:
        (path / "chat_template.jinja").write_text(jinja)
    return path


@pytest.fixture
def folder(tmp_path):
    return make_folder(tmp_path / "ckpt", generation={"eos_token_id": [2, 0], "bos_token_id": 0})


def test_renders_chatml_exactly(folder):
    tok = load_hf_tokenizer(folder)
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False) == RENDERED
    assert tok.apply_chat_template(CHAT) == RENDERED + GEN_PROMPT  # add_generation_prompt defaults to True
    thinking_off = tok.apply_chat_template(CHAT, enable_thinking=False)
    assert thinking_off == RENDERED + GEN_PROMPT + "<think>\n\n</think>\n\n"
    assert tok.apply_chat_template(CHAT[:1], tools=TOOLS, add_generation_prompt=False).startswith(
        '<|im_start|>system\n# Tools\n'
        '{"name": "météo", "description": "a<b & \'c\'", "parameters": {"type": "object"}}\n'
        "<|im_end|>\n<|im_start|>system\n")
    ids = tok.apply_chat_template(CHAT, tokenize=True)
    assert ids == tok.encode(RENDERED + GEN_PROMPT, add_special_tokens=False).ids
    assert ids[0] == 1 and ids.count(2) == 3  # <|im_start|> and <|im_end|> are single tokens
    assert tok.decode(ids, skip_special_tokens=False) == RENDERED + GEN_PROMPT


def test_special_tokens_and_delegation(folder):
    tok = load_hf_tokenizer(folder)
    # tokenizer_config first, then generation_config
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_ids == [2, 0]
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0  # AddedToken dict
    assert tok.bos_token is None and tok.bos_token_id == 0  # from generation_config
    assert isinstance(tok.backend_tokenizer, Tokenizer)
    assert tok.get_vocab_size() == tok.backend_tokenizer.get_vocab_size()
    assert tok.token_to_id("<|im_start|>") == 1
    ids = tok.encode("Hello there<|im_end|>").ids
    assert tok.decode(ids, skip_special_tokens=True) == "Hello there"

    # an int eos_token_id, a plain-dict AddedToken, and a folder without generation_config
    make_folder(folder, config={"eos_token": {"content": "<|endoftext|>"}}, generation={"eos_token_id": 2})
    assert load_hf_tokenizer(folder).eos_token_ids == [0, 2]
    bare = make_folder(folder.parent / "bare", config={})
    tok = load_hf_tokenizer(bare)
    assert ((tok.eos_token_ids, tok.bos_token_id, tok.pad_token_id, tok.chat_template)
            == ([], None, None, None))


# transformers' {% generation %} tag (for assistant-token masks) must parse and render its body
GENERATION_TAG = CHATML.replace("{{ message['content'] }}<|im_end|>",
                                "{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}")


@pytest.mark.parametrize("where,template", [("tokenizer_config", CHATML), ("jinja_file", CHATML),
                                            ("jinja_file", GENERATION_TAG)],
                         ids=["config", "jinja", "generation_tag"])
def test_matches_transformers(tmp_path, where, template):
    transformers = pytest.importorskip("transformers")
    config = {"eos_token": "<|im_end|>", "pad_token": ADDED_PAD}
    if where == "tokenizer_config":
        path = make_folder(tmp_path / where, config={**config, "chat_template": template})
    else:  # the file wins over tokenizer_config's template, in both libraries
        path = make_folder(tmp_path / where, config={**config, "chat_template": "stale"}, jinja=template)
    ours, theirs = load_hf_tokenizer(path), transformers.AutoTokenizer.from_pretrained(str(path))
    assert ours.chat_template == theirs.chat_template == template
    assert ours.apply_chat_template(CHAT).count("I am fine.<|im_end|>") == 1
    for kwargs in [dict(add_generation_prompt=False), dict(add_generation_prompt=True),
                   dict(add_generation_prompt=True, enable_thinking=False), dict(tools=TOOLS)]:
        text = theirs.apply_chat_template(CHAT, tokenize=False, **kwargs)
        assert ours.apply_chat_template(CHAT, **{"add_generation_prompt": False, **kwargs}) == text
        ids = theirs.apply_chat_template(CHAT, tokenize=True, return_dict=False, **kwargs)
        assert (ours.apply_chat_template(CHAT, tokenize=True, **{"add_generation_prompt": False, **kwargs})
                == ids)


def test_list_of_named_templates(tmp_path):
    named = [{"name": "tool_use", "template": "TOOLS {{ tools | length if tools else 0 }}"},
             {"name": "default", "template": "DEFAULT {{ messages | length }}"}]
    tok = load_hf_tokenizer(make_folder(tmp_path / "a", config={"chat_template": named}))
    assert tok.chat_template == "DEFAULT {{ messages | length }}"
    assert sorted(tok.chat_templates) == ["default", "tool_use"]
    assert tok.apply_chat_template(CHAT) == "DEFAULT 2"
    # transformers picks tool_use when tools are given
    assert tok.apply_chat_template(CHAT, tools=TOOLS) == "TOOLS 1"
    assert tok.apply_chat_template(CHAT, chat_template="tool_use") == "TOOLS 0"
    assert tok.apply_chat_template(CHAT, chat_template="literal {{ bos_token }}") == "literal "

    tok = load_hf_tokenizer(make_folder(tmp_path / "b", config={"chat_template": named[:1]}))
    with pytest.raises(ValueError,
                       match=r"\['tool_use'\] but none is called 'default'.*chat_template=<name>"):
        tok.apply_chat_template(CHAT)


def test_missing_template_and_tokenizer_json(tmp_path):
    tok = load_hf_tokenizer(make_folder(tmp_path / "a", config={}))
    with pytest.raises(ValueError, match=r"has no chat template: add a chat_template\.jinja"):
        tok.apply_chat_template(CHAT)
    with pytest.raises(ValueError, match="empty conversation"):
        HFTokenizer(_tokenizer(), "x").apply_chat_template([])

    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "vocab.json").write_text("{}")
    (slow / "merges.txt").write_text("")
    with pytest.raises(FileNotFoundError,
                       match=r"no tokenizer\.json .*vocab\.json, merges\.txt.*save_pretrained"):
        load_hf_tokenizer(slow)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_hf_tokenizer(tmp_path / "nowhere")


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json", "tokenizer.json"])
def test_bad_json_names_file_and_fix(folder, name):
    (folder / name).write_text('{"eos_token": "<|im_end|>",')
    with pytest.raises(ValueError, match=rf"(?s){name} is not (a )?valid .*(fix the file|save_pretrained)"):
        load_hf_tokenizer(folder)


def test_bad_fields(folder):
    make_folder(folder, config={"eos_token": "<|nope|>"})
    with pytest.raises(ValueError, match=r"eos_token '<\|nope\|>' .* not in the vocabulary"):
        load_hf_tokenizer(folder)
    make_folder(folder, config={"chat_template": 3})
    with pytest.raises(ValueError, match="chat_template must be a string or a list"):
        load_hf_tokenizer(folder)
    make_folder(folder, config={}, generation={"eos_token_id": "2"})
    with pytest.raises(ValueError, match="eos_token_id must be an int or a list of ints"):
        load_hf_tokenizer(folder)


def test_template_errors(folder):
    def render(template):
        make_folder(folder, jinja=template)
        return load_hf_tokenizer(folder).apply_chat_template(CHAT)

    with pytest.raises(SecurityError, match=rf"chat template of {folder} was stopped by the jinja2 sandbox"):
        render("{{ ''.__class__.__mro__ }}")
    with pytest.raises(SecurityError, match="sandbox"):
        render("{% set x = messages.append(1) %}")  # immutable: no mutating the caller's data
    with pytest.raises(TemplateError, match=rf"chat template of {folder} raised: Roles must alternate"):
        render("{{ raise_exception('Roles must alternate') }}")
    with pytest.raises(TemplateError, match=r"failed: TypeError: object of type 'NoneType' has no len"):
        render("{{ tools | length }}")
    with pytest.raises(ValueError, match=r"does not parse \(line 1"):
        render("{% for m in messages %}")
    year = render("{{ strftime_now('%Y') }}")
    assert int(year) in {datetime.now().year - 1, datetime.now().year}


def test_python_files_are_never_imported(tmp_path):
    marker = tmp_path / "imported"
    path = make_folder(tmp_path / "ckpt", config={
        "chat_template": CHATML, "tokenizer_class": "EvilTokenizer",
        "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}})
    (path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass EvilTokenizer: pass\n")
    assert load_hf_tokenizer(path).apply_chat_template(CHAT) == RENDERED + GEN_PROMPT
    assert not marker.exists()
