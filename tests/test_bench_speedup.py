"""tools/bench_speedup.py's two timing modes on a tiny checkpoint, eager: whole generates rotated per
chunk, and engine steps interleaved (--interleave): the same greedy tokens as each other and as
plain decoding, the tokens counted per chunk, an A/A contender (plain_b) parsed as plain; and the
contenders in processes of their own (--isolate) giving the same tokens and counts."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("_bench_speedup", ROOT / "tools" / "bench_speedup.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_interleaved_steps_give_the_chunk_mode_s_outputs_and_count_every_token(tmp_path, tiny_ckpt):
    """Two contenders (plain, mtp1), two chunks of 3 prompts at concurrency 2: the interleaved
    mode's outputs equal the chunk mode's and plain decoding's token for token, each step of a
    contender is timed (seconds > 0), and a whole run counts every output token per chunk."""
    import mtpx
    tool = _tool()
    assert tool._contender("plain_b") == (None, None) and tool._contender("mtp4_x") == ("mtp8", 4)
    questions = ["what is 2 + 3?", "def f(x): return x", "Answer: 42", "how many apples?", "x + 1", "f(x)"]
    prompts = [tool.format_prompt(q) for q in questions]
    chunks = [prompts[0::2], prompts[1::2]]                       # the tool's --rounds 2
    params = mtpx.SamplingParams(max_tokens=7)
    reference = mtpx.LLM(model=str(tiny_ckpt))
    want = [[o.output_token_ids for o in reference.generate(c, params)] for c in chunks]
    contenders = {name: tool.Contender(mtpx.LLM(model=str(tiny_ckpt), spec=spec, num_speculative_tokens=k,
                                                max_num_seqs=2), tool._engine_time)
                  for name, spec, k in (("plain", None, None), ("mtp1", "mtp1", 1))}
    for c, chunk in enumerate(chunks):
        rotated = tool.run_chunk(contenders, chunk, params, c, 2, interleave=0)
        interleaved = tool.run_chunk(contenders, chunk, params, c, 2, interleave=2)
        for name in contenders:
            assert rotated[name]["token_ids"] == want[c], name
            assert interleaved[name]["token_ids"] == want[c], name
            assert interleaved[name]["seconds"] > 0 and interleaved[name]["host_s"] > 0
            assert interleaved[name]["tokens"] == sum(map(len, want[c]))
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n" for q in questions))
    run = ["--model", str(tiny_ckpt), "--data", str(data), "--num-prompts", "6", "--rounds", "2",
           "--max-tokens", "7", "--concurrency", "2", "--threads", "1", "--interleave", "2",
           "--build-reversed"]
    for extra in (["--share-weights", "--contenders", "plain", "plain_b"],
                  ["--isolate", "--contenders", "plain", "mtp1"]):
        out = tmp_path / extra[0]
        assert tool.main(run + extra + ["--out", str(out)]) == 0
        rows = {r["contender"]: r for r in json.loads((out / "speedup.json").read_text())["rows"]}
        assert list(rows) == extra[2:]
        for r in rows.values():
            assert r["mismatches_vs_plain"] == 0 and r["host_s"] > 0
            assert [c["tokens"] for c in r["chunks"]] == [sum(map(len, w)) for w in want]
            assert r["output_tokens"] == sum(len(x) for w in want for x in w)
        assert "2 steps interleaved" in (out / "speedup.md").read_text()
    assert rows["mtp1"]["acceptance_length"] > 1 and rows["plain"]["acceptance_length"] is None
