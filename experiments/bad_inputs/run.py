"""The bad inputs of issue "What a vLLM or transformers user trips over", item 2, and the one line
each now gets. Run from the repository root: `python experiments/bad_inputs/run.py`; it writes
experiments/bad_inputs/after.md (the table's "now" column)."""
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
    rows.append((f"`{' '.join(argv)}`", check_overrides(list(argv), CONF) or "(composes: checked when the run starts)"))


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

lines = ["| input | now |", "|---|---|"] + [f"| {a} | {str(b).replace('|', '/')} |" for a, b in rows]
atomic_write_text(ROOT / "experiments" / "bad_inputs" / "after.md", "\n".join(lines) + "\n")
print("\n".join(lines))
