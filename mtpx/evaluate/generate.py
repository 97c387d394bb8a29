"""The timed generation of mode=eval and mode=bench (a warm-up request, then the prompts through
the benchmark client with a progress bar and live W&B points, stopped at a step boundary by
Ctrl-C), and the rows of outputs.jsonl: written as each request finishes, read back to resume."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from rich.progress import Progress



from mtpx import auto_k
from mtpx.data.gsm8k import extract_predicted_answer, score
from mtpx.data.prompts import Prompt
from mtpx.engine.llm import LLM
from mtpx.core.sampling_params import SamplingParams
from mtpx.io import GracefulInterrupt, Interrupted
from mtpx.metrics.progress import ProgressLines
from mtpx.metrics.logging import RunLogger
from mtpx.outputs import RequestOutput, SpecDecodeCounts


class _Stop(Exception):
    """Raised from on_step when Ctrl-C asked the run to stop (GracefulInterrupt)."""


def _generate(llm: LLM, prompts: list[Prompt], params, label: str, client: dict,
              interrupt: GracefulInterrupt, rows_file: Path | None = None, logger: RunLogger | None = None,
              indices: list[int] | None = None, clock: float = 0.0):
    """Timed generation after a 2-token warm-up request (first-call allocations and lazy
    initialisation are not billed to the first measured run). The prefix cache is emptied after
    the warm-up so that its blocks do not count as hits. client: generate()'s max_concurrency and
    arrival_offsets. Each finished request's row is appended to rows_file as it finishes; the
    progress bar and the W&B run (`live/*`, at most twice a second) show output tokens/s and the
    acceptance so far (without a terminal: a line every MTPX_PROGRESS_S seconds, ProgressLines).
    indices: each prompt's request index (default 0, 1, ...); clock: seconds
    of the run before this pass (a resumed eval): output times are seconds on the run's clock.

    Returns (outputs, seconds, interrupted): after Ctrl-C or SIGTERM (interrupt.requested), the
    engine stops at the next step boundary and outputs holds the requests that had finished, in
    index order."""
    indices = list(range(len(prompts))) if indices is None else indices
    llm.generate([prompts[0].engine_input], SamplingParams(max_tokens=2))
    llm.reset_prefix_cache()
    auto_k.reset_histograms(llm.engine.draft_length)    # k per step, depths: the measured pass only
    done: dict[int, RequestOutput] = {}
    sink = rows_file.open("a", encoding="utf-8") if rows_file is not None else None

    live = {"tokens": 0, "drafts": 0, "committed": 0, "draft_tokens": 0, "accepted": 0, "logged": 0.0}

    def on_clock(o: RequestOutput) -> RequestOutput:
        origin = t0 - clock
        at = (lambda t: None if t is None else t - origin)                # noqa: E731
        return dataclasses.replace(o, index=indices[o.index], arrival_time=o.arrival_time - origin,
                                   first_token_time=at(o.first_token_time), finish_time=at(o.finish_time),
                                   emission_times=[t - origin for t in o.emission_times])

    def on_finish(r) -> None:
        o = done[r.index] = on_clock(llm.request_output(r))
        live["tokens"] += len(o.output_token_ids)
        for key, n in (("drafts", o.spec.num_drafts), ("committed", o.spec.num_committed_tokens),
                       ("draft_tokens", o.spec.num_draft_tokens), ("accepted", o.spec.num_accepted_tokens)):
            live[key] += n
        elapsed = max(time.perf_counter() - t0, 1e-9)
        stats = {"live/output_tok_s": live["tokens"] / elapsed, "live/requests_finished": len(done)}
        if live["drafts"]:
            stats["live/acceptance_length"] = live["committed"] / live["drafts"]
            stats["live/acceptance_rate"] = live["accepted"] / live["draft_tokens"]
        text = f"{label} · {stats['live/output_tok_s']:.0f} tok/s" + (
            f" · acceptance length {stats['live/acceptance_length']:.2f}" if live["drafts"] else "")
        progress.update(task, advance=1, description=text)
        lines.update(len(done), f"{stats['live/output_tok_s']:.0f} tok/s",
                     f"acceptance length {stats['live/acceptance_length']:.2f}" if live["drafts"] else None)
        if logger is not None and time.perf_counter() - live["logged"] >= 0.5:
            live["logged"] = time.perf_counter()
            logger.log(stats)
        if sink is not None:
            sink.write(json.dumps(_output_row(o, prompts[r.index]), ensure_ascii=False) + "\n")
            sink.flush()

    def on_step(engine) -> None:
        _show_running(engine, live, t0, lambda text: progress.update(task, description=f"{label} · {text}"),
                      lines, len(done))
        if interrupt.requested:
            raise _Stop

    try:
        with Progress(transient=True) as progress:
            task = progress.add_task(label, total=len(prompts))
            lines = ProgressLines(label, len(prompts), "requests")
            t0 = time.perf_counter()
            try:
                outs = llm.generate([p.engine_input for p in prompts], params, on_finish=on_finish,
                                    on_step=on_step, **client)
            except _Stop:
                return [done[i] for i in sorted(done)], time.perf_counter() - t0, True
            except KeyboardInterrupt:       # a second Ctrl-C / SIGTERM: stop at once, say what is kept
                if not done or rows_file is None:
                    raise
                raise Interrupted(f"stopped at once by a second signal: the {len(done)} requests that had "
                                  f"finished are in {rows_file}; no metrics.json or report was "
                                  "written") from None
            return [on_clock(o) for o in outs], time.perf_counter() - t0, False
    finally:
        if sink is not None:
            sink.close()


def _show_running(engine, live: dict, t0: float, describe, lines: ProgressLines, done: int) -> None:
    """Every 0.5 s, the output tokens so far, running requests' included, on the bar (describe)
    and the progress lines: they move before the first request finishes (concurrency 64)."""
    now = time.perf_counter()
    if now - live.get("shown", 0.0) >= 0.5:
        live["shown"] = now
        tokens = live["tokens"] + sum(len(r.output_token_ids) for r in engine.scheduler.running)
        rate = f"{tokens / max(now - t0, 1e-9):.0f} tok/s"
        accepted = f"acceptance length {live['committed'] / live['drafts']:.2f}" if live["drafts"] else None
        describe(" · ".join(x for x in (rate, f"{tokens} tokens", accepted) if x))
        lines.update(done, rate, f"{tokens} tokens", accepted)
    lines.tick()


def _output_row(o: RequestOutput, p: Prompt) -> dict:
    """One line of outputs.jsonl."""
    row = {"index": o.index, "category": p.category, "prompt": p.text,
           "num_prompt_tokens": len(o.prompt_token_ids), "output_token_ids": o.output_token_ids,
           "text": o.text, "finish_reason": o.finish_reason, "error": o.error}
    if p.answer is not None:
        predicted = extract_predicted_answer(o.text) if not o.error else None
        row |= {"answer": p.answer, "predicted_answer": predicted,
                "correct": predicted is not None and score([predicted], [p.answer])[1] == 1}
    return row | {"rounds": o.spec.rounds, "num_drafts": o.spec.num_drafts,
                  "num_draft_tokens": o.spec.num_draft_tokens,
                  "num_accepted_tokens": o.spec.num_accepted_tokens,
                  "num_committed_tokens": o.spec.num_committed_tokens,
                  "num_cached_tokens": o.num_cached_tokens, "num_preemptions": o.num_preemptions,
                  "arrival_s": o.arrival_time, "first_token_s": o.first_token_time, "finish_s": o.finish_time,
                  "emission_s": o.emission_times}


def _restore(row: dict, p: Prompt, prompt_ids: list[int], k: int) -> RequestOutput:
    """A finished request of an earlier pass (eval.resume) from its outputs.jsonl row: the same
    tokens, counters and times (seconds on the run's clock)."""
    spec = SpecDecodeCounts()
    for nd, acc, committed in row["rounds"]:
        spec.record_round(nd, acc, committed)
    spec.accepted_per_position += [0] * (k - len(spec.accepted_per_position))
    return RequestOutput(index=row["index"], prompt_token_ids=prompt_ids,
                         output_token_ids=row["output_token_ids"],
                         text=row["text"], finish_reason=row["finish_reason"], spec=spec,
                         arrival_time=row["arrival_s"], first_token_time=row["first_token_s"],
                         finish_time=row["finish_s"], emission_times=row["emission_s"],
                         num_cached_tokens=row["num_cached_tokens"], num_preemptions=row["num_preemptions"],
                         prompt=p.text or None)


def finished_rows(rows_file: Path, prompts: list[Prompt], llm: LLM) -> dict[int, RequestOutput]:
    """eval.resume: {request index: output} of the requests that finished (stop or length, no
    error) in rows_file, an earlier run of the same command; {} without the file. A torn last
    line is ignored. Raises ValueError (naming eval.resume) for a row of another prompt set or an
    older outputs.jsonl without times."""
    if not rows_file.exists():
        return {}
    lines = rows_file.read_text(encoding="utf-8").splitlines()
    out = {}
    for n, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break                      # the line being written when the run stopped
            raise ValueError(f"eval.resume=true: {rows_file} line {n + 1} is not JSON: delete the file "
                             "(or the line) to start over") from None
        i = row.get("index")
        if row.get("finish_reason") not in ("stop", "length") or row.get("error") or not isinstance(i, int):
            continue
        if not 0 <= i < len(prompts) or row.get("prompt") != prompts[i].text:
            raise ValueError(f"eval.resume=true: {rows_file} row {i} is not this run's prompt {i}: resume "
                             "with the same data and eval settings, or use a new hydra.run.dir")
        if "arrival_s" not in row:
            raise ValueError(f"eval.resume=true: {rows_file} was written by an older mtpx (rows without "
                             "times): delete it to start over")
        p = prompts[i]
        ids = list(p.token_ids) if p.token_ids is not None else llm.encode(p.text)
        if row.get("num_prompt_tokens") != len(ids):
            raise ValueError(f"eval.resume=true: {rows_file} row {i} has {row.get('num_prompt_tokens')} "
                             f"prompt tokens, this run's prompt {i} {len(ids)}: resume with the same model "
                             "and data, or use a new hydra.run.dir")
        out[i] = _restore(row, p, ids, llm.num_speculative_tokens)
    return out
