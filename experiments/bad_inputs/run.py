"""The bad inputs of issue "What a vLLM or transformers user trips over", item 2, and those of
issue 41 ("What a user still trips over"), and the one line or the behaviour each now gets. Run
from the repository root: `python experiments/bad_inputs/run.py` (about a minute on 2 cores; a few
cases run train_or_eval.py in a subprocess); it writes experiments/bad_inputs/after.md (the
tables' "now" columns)."""
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.cli import check_overrides  # noqa: E402
from mtpx.io import atomic_write_text  # noqa: E402

CONF = ROOT / "conf"
rows = []


def cli(*argv: str) -> None:
    rows.append((f"`{' '.join(argv)}`",
                 check_overrides(list(argv), CONF) or "(composes: checked when the run starts)"))


def api(label: str, fn) -> None:
    try:
        out = fn()
        rows.append((label, out))
    except (ValueError, TypeError, FileNotFoundError) as e:
        rows.append((label, f"{type(e).__name__}: {e}"))


cli("+spce=mtp8")
cli("+eval.num_promts=8")
cli("eval.num_promts=8")
cli("+spec=mtp8", "spec.num_speculative_tokens=2.5")
cli("+spec=mtp8", "spec.num_speculative_tokens=abc")

tmp = Path(tempfile.mkdtemp())
demo = ROOT / "checkpoints" / "demo"
for label, edit in (("config.json hidden_size \"128\"", {"hidden_size": "128"}),
                    ("config.json hidden_size null", {"hidden_size": None}),
                    ("config.json hidden_size -4", {"hidden_size": -4}),
                    ("config.json layer_types as a string", {"layer_types": "linear_attention"})):
    folder = tmp / label.replace(" ", "_").replace('"', "")
    shutil.copytree(demo, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(edit)
    (folder / "config.json").write_text(json.dumps(cfg))
    api(label, lambda f=folder: LLM(model=f))
api("model.path pointing at a file", lambda: LLM(model=demo / "config.json"))

from mtpx.engine.config import EngineConfig  # noqa: E402
api("engine.block_size=4096", lambda: EngineConfig(block_size=4096))

llm = LLM(model=demo)
for label, prompt in (("prompt 1.5 (a float token id)", [1, 1.5]), ("prompt b'bytes'", b"bytes"),
                      ("None in a prompt list", None), ("a lone surrogate", "\ud800")):
    api(label, lambda p=prompt: llm.generate([p, "ok"], SamplingParams(max_tokens=2))[0].error)
api("SamplingParams(seed=2**70)", lambda: SamplingParams(seed=2**70))

first = rows[:]
rows.clear()
# ---- issue 41 ("What a user still trips over"): item number, then the case -------------------------
import contextlib  # noqa: E402
import errno  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

from omegaconf import OmegaConf  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MTPX_PROGRESS_S": "1"}


def entry(*argv: str, term_after: float | None = None, wait_for=None) -> tuple[int, str, str]:
    """train_or_eval.py ARGV in a subprocess (stderr a pipe, not a terminal); SIGTERM after
    `term_after` seconds once wait_for() is true. Returns (exit code, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "train_or_eval.py"), *argv], cwd=tmp, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if term_after is not None:
        t0 = time.time()
        while wait_for is not None and not wait_for() and proc.poll() is None and time.time() - t0 < 120:
            time.sleep(0.1)
        time.sleep(term_after)
        proc.send_signal(signal.SIGTERM)
        t_term = time.time()
    out, err = proc.communicate(timeout=300)
    if term_after is not None:
        exit_s.append(round(time.time() - t_term, 1))      # SIGTERM to exit, files written
    return proc.returncode, out, err


exit_s: list[float] = []


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def last(err: str, prefix: str = "") -> str:
    found = [ln for ln in err.strip().splitlines() if ln.startswith(prefix)]
    return found[-1] if found else "(no such line)"


def stderr_of(fn) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        fn()
    return buf.getvalue().strip()


def warned(fn) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return "; ".join(f"{w.category.__name__}: {w.message}" for w in caught) or "(no warning)"


# 1. SIGTERM (as timeout, docker, SLURM and Kubernetes send it), in eval and in training
run = tmp / "sigterm_eval"
EVAL = ("+spec=mtp8", "eval.num_prompts=12", "eval.concurrency=1", "eval.max_tokens=16", "logger=none",
        "eval.check_lossless=false", f"hydra.run.dir={run}")
code, _, err = entry(*EVAL, term_after=0.3, wait_for=lambda: _read(run / "outputs.jsonl").count("\n") >= 2)
m = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else {}
rows.append(("1: SIGTERM during `mode=eval` (12 prompts)", f"exit {code} {exit_s[-1]} s after SIGTERM; "
             f"{last(err, 'interrupted')} "
             f"[metrics.json: partial={m.get('partial')}, num_requests={m.get('num_requests')}]"))
code, out_text, err = entry(*EVAL, "eval.resume=true")
m = json.loads((run / "metrics.json").read_text())
rows.append(("1: the same command with `eval.resume=true`", f"exit {code}; {last(out_text, 'eval.resume')} "
             f"[metrics.json: partial={m.get('partial')}, num_requests={m['num_requests']}, "
             f"resumed_requests={m.get('resumed_requests')}]"))
gsm = tmp / "gsm8k.jsonl"
gsm.write_text("".join(json.dumps({"question": f"Tom has {i} apples and buys {i} more. How many?",
                                   "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}) + "\n"
                       for i in range(300)))
out = tmp / "train_out"
code, _, err = entry("mode=train", "logger=none", f"hydra.run.dir={tmp / 'train_run'}",
                     f"train.out_dir={out}",
                     "model.num_hidden_layers=2", "model.hidden_size=32", "model.intermediate_size=64",
                     "model.num_nextn_predict_layers=2", "train.steps=100000", "train.batch_size=2",
                     "train.seq_len=32",
                     "train.eval_every=0", "train.data_sources=[gsm8k]", f"train.gsm8k_path={gsm}",
                     "train.tokenizer_vocab_size=300", "train.threads=1", "train.log_every=1", term_after=1.0,
                     wait_for=lambda: "loss" in _read(tmp / "train_run" / "train_or_eval.log"))
state = json.loads((out / "trainer_state.json").read_text()) if (out / "trainer_state.json").exists() else {}
rows.append(("1: SIGTERM during `mode=train` (save_every 200, the default)",
             f"exit {code} {exit_s[-1]} s after SIGTERM; {last(err, 'interrupted')} "
             f"[trainer_state.json step {state.get('step')}]"))

# 2. progress without a terminal (stderr a pipe): a line every MTPX_PROGRESS_S seconds
code, _, err = entry("+spec=mtp8", "eval.num_prompts=6", "eval.concurrency=1", "eval.max_tokens=32",
                     "logger=none", "eval.check_lossless=false", f"hydra.run.dir={tmp / 'progress'}")
rows.append(("2: `mode=eval` with stderr a pipe, MTPX_PROGRESS_S=1", last(err, "mtp8: 6 prompts")))

# 3. tracebacks before: now one line
rows.append(("3: `hydra.run.dir=/proc/mtpx/run`", check_overrides(["hydra.run.dir=/proc/mtpx/run"], CONF)))
api("3: `logger.dir=/proc/mtpx`",
    lambda: __import__("mtpx.metrics.logging", fromlist=["RunLogger"]).RunLogger(
    {"name": "wandb", "dir": "/proc/mtpx"}, run_dir=tmp, config={}))
api("3: `distill.out_dir=/proc/x/y`",
    lambda: __import__("mtpx.io", fromlist=["check_writable_dir"]).check_writable_dir(
    "/proc/x/y", "distill.out_dir"))
from mtpx.io import disk_error_line  # noqa: E402
from mtpx.train.setup import check_device as _check_device  # noqa: E402
api("3: `train.device=cuda` on a CPU build", lambda: _check_device("cuda"))
api("3: a full disk at a save (ENOSPC injected)", lambda: disk_error_line(
    OSError(errno.ENOSPC, "No space left on device", str(tmp / "ckpt" / "model.safetensors"))))
api("3: `engine.compile_backend=foo`", lambda: EngineConfig(compile_backend="foo"))
hf = tmp / "hf_string"
hf.mkdir()
(hf / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                            "vocab_size": 100, "hidden_size": "64", "intermediate_size": 128,
                                            "num_hidden_layers": 2, "num_attention_heads": 4}))
from mtpx.hf.loader import load_config  # noqa: E402
api("3: a Hugging Face config.json with `\"hidden_size\": \"64\"`", lambda: load_config(hf))

# 4. silently wrong before
from mtpx.data.prompts import Prompt  # noqa: E402
from mtpx.evaluate import cap_max_tokens, model_path  # noqa: E402
api("4: `eval.max_tokens=100000` (max_model_len 1024)", lambda: stderr_of(lambda: cap_max_tokens(
    [Prompt(text="x", token_ids=[1] * 7)], [SamplingParams(max_tokens=100000)], 1024, "eval.max_tokens")))
api("4: `SamplingParams(max_tokens=10**6)`", lambda: warned(
    lambda: llm.generate("def f(x):", SamplingParams(max_tokens=10**6, ignore_eos=True, stop_token_ids=[0]))))
api("4: `model.path=` (empty)", lambda: model_path(OmegaConf.create({"model": {"path": ""}})))
for label, edit in (("4: config.json `num_nextn_predict_layers` 4, the weights hold 8",
                     {"num_nextn_predict_layers": 4}),
                    ("4: config.json `eos_token_id` outside the vocabulary", {"eos_token_id": 100000})):
    folder = tmp / label.split("`")[1]
    shutil.copytree(demo, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(edit)
    (folder / "config.json").write_text(json.dumps(cfg))
    api(label, lambda f=folder: LLM(model=f))
api("4: `LLM(..., num_speculative_tokens=2.5)`",
    lambda: LLM(model=demo, spec="mtp8", num_speculative_tokens=2.5))

# 5. misleading messages before
from mtpx.evaluate import dead_position_warning  # noqa: E402
from mtpx.metrics.stats import SpecDecodeCounts  # noqa: E402
code, out_text, err = entry("+spec=mtp8", "eval.num_prompts=3", "engine.max_model_len=10", "logger=none",
                            f"hydra.run.dir={tmp / 'all_failed'}")
rows.append(("5: every request fails (`engine.max_model_len=10`)",
             f"exit {code}; {len(err.strip().splitlines())} lines on "
             f"stderr, the last: {last(err)}; report printed: {'Acceptance' in out_text}"))
api("5: a broken MTP module (position 2 never accepts)", lambda: dead_position_warning(
    SpecDecodeCounts(accepted_per_position=[50, 30, 0, 0])))
from mtpx.engine.threads import ONE_CPU, ThreadChoice  # noqa: E402
api("5: one CPU", lambda: ThreadChoice(1, ONE_CPU, 1, {1: 3.0}).describe())
from mtpx.schema import config_groups_text  # noqa: E402
api("5: `--help`: the config groups", lambda: config_groups_text(CONF).replace("\n", "; "))
code, _, err = entry(f"model.path={tmp / 'nowhere'}", "logger=none", f"hydra.run.dir={tmp / 'failed_start'}")
rows.append(("5: an error after Hydra started (a missing checkpoint)",
             f"exit {code}; {last(err)}; run folder left: "
             f"{(tmp / 'failed_start').exists()}"))

# 6. the Python API against vLLM's habits
sp = SamplingParams(max_tokens=4, ignore_eos=True)
api("6: `generate(\"a string\")`", lambda: repr(llm.generate("def f(x):", sp)[0].text))
api("6: `use_tqdm=True`",
    lambda: stderr_of(lambda: llm.generate(["a", "b"], sp, use_tqdm=True)).split("\r")[-1])
ids = llm.get_tokenizer().encode("def f(x):").ids
api("6: `{\"prompt_token_ids\": [...]}` and `{\"prompt\": ...}`", lambda: [
    o.text == llm.generate("def f(x):", sp)[0].text for o in llm.generate([{"prompt_token_ids": ids},
                                                                           {"prompt": "def f(x):"}], sp)])
api("6: a generator of prompts", lambda: len(llm.generate((p for p in ["a", "b", "c"]), sp)))
api("6: `get_tokenizer()`", lambda: type(llm.get_tokenizer()).__name__)
api("6: `chat(messages)` on the demo (no chat template)",
    lambda: llm.chat([{"role": "user", "content": "hi"}], sp))
api("6: `chat(messages, chat_template=...)`", lambda: repr(llm.chat(
    [[{"role": "user", "content": "hi"}]], sp,
    chat_template="{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
    "{% endfor %}assistant:")[0].prompt))
api("6: `RequestOutput.metrics`", lambda: type(llm.generate("a", sp)[0].metrics).__name__)
api("6: `min_tokens=3, include_stop_str_in_output=True`", lambda: len(llm.generate(
    "a", SamplingParams(max_tokens=6, min_tokens=3,
                        include_stop_str_in_output=True))[0].output_token_ids) >= 3)
api("6: `speculative_config={\"method\": \"deepseek_mtp\"}`", lambda: LLM(
    model=demo, speculative_config={"method": "deepseek_mtp", "num_speculative_tokens": 2}).spec)
api("6: `dtype=\"auto\"`", lambda: str(next(LLM(model=demo, dtype="auto").model.parameters()).dtype))
api("6: `SamplingParams(temperature='0.5')`", lambda: SamplingParams(temperature="0.5"))
api("6: a hub id, `LLM(\"Qwen/Qwen3-Next-80B-A3B-Instruct\")`",
    lambda: LLM(model="Qwen/Qwen3-Next-80B-A3B-Instruct"))

# 7. sweeps: a multirun ends with its table (and sweep.md in the sweep folder)
sweep = tmp / "sweep"
code, out_text, err = entry("-m", "+spec=mtp8", "spec.num_speculative_tokens=9,2", "eval.num_prompts=1",
                            "eval.max_tokens=4", "logger=none", f"hydra.sweep.dir={sweep}")
tail = [ln for ln in out_text.strip().splitlines() if ln.startswith(("- job", "sweep table:", "2 job"))]
rows.append(("7: `-m ... spec.num_speculative_tokens=9,2` (job 0 fails)",
             f"exit {code}; " + " / ".join(tail)))

# 8. train.threads
from mtpx.train.setup import choose_train_threads as _choose_threads  # noqa: E402
from mtpx.train.distributed import DistInfo  # noqa: E402
os.environ.pop("OMP_NUM_THREADS", None)
api("8: `train.threads=null` (the default)",
    lambda: _choose_threads(OmegaConf.create({"threads": None}), llm.model,
                          DistInfo(), None).describe())


def io_out(fn) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn()
    return buf.getvalue().strip()


issue41 = rows[:]
rows.clear()
# ---- issue 73 ("What still trips a user"): item number, then the case ------------------------------
# 1. min_tokens with a stop string (vLLM's meaning: a stop string before min_tokens does not end it)
q = "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:"
o = llm.generate(q, SamplingParams(max_tokens=60, min_tokens=30, stop=["\n"]))[0]
full = llm.decode(o.output_token_ids)
rows.append(("1: `min_tokens=30, stop=[\"\\n\"]` (Python API; the server cuts alike)",
             f"finish_reason {o.finish_reason}, {len(o.output_token_ids)} tokens; the text is their decoding "
             f"cut at the stop that ends in token 30 or later: {full.startswith(o.text)} and "
             f"{len(o.text) >= len(llm.decode(o.output_token_ids[:29]).rstrip())}"))
# 2. the Python API's torch errors
api("2: `LLM(device=\"cuda\")` on a CPU build", lambda: LLM(model=demo, device="cuda"))
api("2: `LLM(device=\"tpu\")`", lambda: LLM(model=demo, device="tpu"))
api("2: `LLM(threads=-2)`", lambda: LLM(model=demo, threads=-2))
api("2: `LLM(threads=0)`", lambda: LLM(model=demo, threads=0))
api("2: `SamplingParams(stop=5)`", lambda: SamplingParams(stop=5))
api("2: `SamplingParams(stop_token_ids=5)`", lambda: SamplingParams(stop_token_ids=5))
api("2: `generate(prompts, {\"max_tokens\": 4})`", lambda: llm.generate(["a"], {"max_tokens": 4}))
api("2: `SamplingParams(temperature=float(\"inf\"))`", lambda: SamplingParams(temperature=float("inf")))
api("2: a stop token id outside the vocabulary", lambda: "that request fails alone: " + llm.generate(
    ["a"], SamplingParams(max_tokens=2, stop_token_ids=[10**6]))[0].error)
# 3. command lines that pointed the wrong way
cli("eval.max_tokens=4", "eval.max_tokens=abc")
cli("+spec=mtp8", "+spec=mtp1")
cli("device=cuda")
cli("tensor_parallel_size=2")
from mtpx.engine.threads import available_cpus, oversubscription_warning  # noqa: E402
api(f"3: `eval.threads=100` ({available_cpus()} CPUs)",
    lambda: oversubscription_warning(100, 1, "eval.threads"))
api(f"3: `engine.tensor_parallel_size={available_cpus() + 2}`",
    lambda: oversubscription_warning(None, available_cpus() + 2, "eval.threads"))
# 4. the cache folder
from mtpx.engine import compile_cache  # noqa: E402
(tmp / "a_file").write_text("x")
os.environ["MTPX_CACHE_DIR"] = str(tmp / "a_file")
api("4: `MTPX_CACHE_DIR` is a file", lambda: stderr_of(compile_cache.usable_cache))
os.environ.pop("MTPX_CACHE_DIR")
efbig = subprocess.run([sys.executable, "-c", "import resource, sys; sys.path.insert(0, sys.argv[1]); "
                        "from mtpx.io import atomic_write_bytes, disk_error_line; "
                        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))\n"
                        "try:\n atomic_write_bytes(sys.argv[2], b'x' * 5000)\n"
                        "except OSError as e:\n print(disk_error_line(e))", str(ROOT), str(tmp / "big.json")],
                       capture_output=True, text=True, timeout=120)
rows.append(("4: a write past the file-size limit (`ulimit -f`, EFBIG)",
             (efbig.stdout + efbig.stderr).strip() or "(nothing)"))
# 5. automatic k
api("5: `spec.cost_model_file` in a folder that does not exist", lambda: LLM(
    model=demo, spec="mtp8", num_speculative_tokens="auto", cost_model_file=tmp / "no_such" / "costs.json"))
# 6. eval.resume with a run folder of no earlier run
code, _, err = entry("eval.resume=true", "logger=none", f"hydra.run.dir={tmp / 'typo'}")
rows.append(("6: `eval.resume=true hydra.run.dir=<a new folder>`", f"exit {code}; {last(err)}"))
# 7. mode=bench with prompts longer than the context
from mtpx.evaluate.lines import _skip_long_prompts  # noqa: E402
api("7: `mode=bench`, 2 of 3 prompts past max_model_len", lambda: io_out(lambda: _skip_long_prompts(
    [Prompt(text="short"), Prompt(text="x " * 2000), Prompt(text="y " * 3000)], llm.encode, llm.max_model_len,
    "bench")))
# 9. the bench HTTP client and the API key
os.environ["MTPX_API_KEY"] = "sesame"
from mtpx.client.openai_http import api_key_headers  # noqa: E402
api("9: `bench.base_url=...` with `MTPX_API_KEY` set", lambda: {
    k: v.replace("sesame", "<key>") for k, v in api_key_headers().items()})
os.environ.pop("MTPX_API_KEY")



def table(rs, title):
    return [f"## {title}", "", "| input | now |", "|---|---|"] + [
        f"| {a} | "
        f"{' '.join(str(b).replace('|', '/').replace(str(tmp), 'DIR').replace(str(ROOT) + '/', '').split())}"
        " |"
        for a, b in rs] + [""]


lines = (table(first, "Issue \"What a vLLM or transformers user trips over\", item 2")
         + table(issue41, "Issue 41 \"What a user still trips over\"")
         + table(rows, "Issue 73 \"What still trips a user\""))
atomic_write_text(ROOT / "experiments" / "bad_inputs" / "after.md", "\n".join(lines))
print("\n".join(lines))
shutil.rmtree(tmp, ignore_errors=True)
