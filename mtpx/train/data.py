"""Training corpora: read documents, split train/val, tokenize, pack into blocks, sample batches.

The pipeline, nanoGPT style, all in memory (GSM8K train is ~1.5M tokens, the stdlib ~4M):

    documents (str)  --split by document-->  train docs / val docs      (no document in both)
        --tokenize, append <|endoftext|>, concatenate per source-->  one token stream per source
        --cut into seq_len blocks (tail dropped)-->  blocks [N, seq_len] int64
        --sample--> batches [batch_size, seq_len]

Corpora ("sources"), chosen by the `data_sources` list of the train config:

    "gsm8k"   GSM8K JSONL ({"question", "answer"} per line), each record formatted with
              mtpx.data.gsm8k.format_example so training text matches the eval prompts exactly
    "stdlib"  the Python standard library's own .py files (a deterministic subset), minus the files
              that the eval prompt set holds out (mtpx.data.prompts.STDLIB_HELDOUT_MODULES)
    "distill" self-distilled data written by mode=distill (`train.distill_path`, a folder or a list
              of folders, concatenated, e.g. GSM8K answers and code answers; "distill.N" is folder
              N of the list alone, a source with its own weight): each
              record's prompt followed by the target's own completion (mtpx/data/distilled.py),
              as the target's token ids when the training tokenizer is the one that generated them
              (equal hashes), else re-encoded from the text

An entry may carry a mixing weight, "name:weight" (default 1): a batch row comes from source k with
probability weight_k / sum(weights), whatever the source's size. So ["gsm8k", "stdlib"] trains
50/50, and ["gsm8k:3", "stdlib"] 75/25.

Batches are a pure function of (seed, step): step s draws its rows with a torch.Generator seeded
from (seed, s). Resuming at step s therefore needs no iterator state, and an interrupted run sees
exactly the batches of an uninterrupted one. Rows are drawn with replacement (as nanoGPT's random
offsets), which is what makes mixing weights exact and skipping O(1).
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from mtpx.data.stdlib import stdlib_dir, stdlib_files  # noqa: F401  (re-exported)
from mtpx.train.tokenizer import encode_batch, eos_token_id

SOURCES = ("gsm8k", "stdlib", "distill")

# --------------------------------------------------------------------------------------------------
# data_sources parsing


@dataclass(frozen=True)
class SourceSpec:
    """One corpus and its mixing weight (relative probability that a batch row comes from it)."""

    name: str
    weight: float = 1.0


def parse_data_sources(entries: Sequence[str]) -> list[SourceSpec]:
    """Parse a `data_sources` list such as ["gsm8k", "stdlib:0.5"].

    Raises:
        ValueError: empty list, unknown source name, repeated source, or a weight that is not a
            positive number.
    """
    if isinstance(entries, str):  # a bare "gsm8k" from the command line
        entries = [entries]
    specs: list[SourceSpec] = []
    for entry in entries:
        name, _, w = str(entry).partition(":")
        name = name.strip()
        if name not in SOURCES and _distill_index(name) is None:
            raise ValueError(f"unknown data source {name!r} in train.data_sources: use any of "
                             f"{list(SOURCES)} (or distill.N: folder N of the train.distill_path list)")
        try:
            weight = float(w) if w else 1.0
        except ValueError:
            raise ValueError(f"data source {entry!r}: the weight after ':' must be a number, "
                             "e.g. 'stdlib:0.5'") from None
        if not weight > 0:
            raise ValueError(f"data source {entry!r}: the weight must be > 0 (drop the source instead)")
        if any(s.name == name for s in specs):
            raise ValueError(f"data source {name!r} is listed twice in train.data_sources: list it once")
        specs.append(SourceSpec(name, weight))
    if not specs:
        raise ValueError("train.data_sources is empty: list at least one of " + str(list(SOURCES)))
    return specs


# --------------------------------------------------------------------------------------------------
# reading documents


@dataclass(frozen=True)
class TokenizedDocument:
    """A document that comes with its token ids (self-distilled data: the tokens the target
    generated, which a re-encoding of the text need not reproduce) and the hash of the tokenizer
    they belong to (mtpx.train.tokenizer.tokenizer_sha256)."""

    text: str
    token_ids: tuple[int, ...]
    tokenizer_sha256: str


Document = str | TokenizedDocument


def doc_text(doc: Document) -> str:
    """The text of a document (what a tokenizer is trained on)."""
    return doc.text if isinstance(doc, TokenizedDocument) else doc


def read_gsm8k(path: str | os.PathLike) -> list[str]:
    """Read a GSM8K JSONL file; return one formatted training document per record.

    Each line is {"question": str, "answer": str}; the document is
    `mtpx.data.gsm8k.format_example(question, answer)` = "Question: {q}\\nAnswer: {a}".
    Blank lines are skipped.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: empty file, or a line is not JSON, lacks a string "question"/"answer" or a
            "####" answer line (names file and line); see mtpx.data.gsm8k.load_gsm8k.
    """
    from mtpx.data.gsm8k import format_example, load_gsm8k  # the eval side owns the format

    return [format_example(r["question"], r["answer"])
            for r in load_gsm8k(path, option="train.gsm8k_path")]


def read_stdlib(max_bytes: int | None = None, root: str | os.PathLike | None = None) -> list[str]:
    """Source text of `stdlib_files(max_bytes, root)`, one document per file.
    Files that are not UTF-8 are skipped (a few legacy test fixtures; none in the default subset)."""
    docs = []
    for p in stdlib_files(max_bytes, root):
        try:
            docs.append(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return docs


def read_distill(path: str | os.PathLike) -> list[TokenizedDocument]:
    """The documents of a complete mode=distill folder, in prompt order: prompt + completion, with
    the token ids prompt_token_ids + completion_token_ids (a final eos dropped: packing appends
    one to every document). Records whose prompt could not be generated (an `error`) are skipped.

    Raises:
        FileNotFoundError, ValueError: see mtpx.data.distilled.read_distilled (no manifest, shards
            not all written, a bad record); ValueError when no record has a completion.
    """
    from mtpx.data.distilled import read_distilled

    manifest, records = read_distilled(path, "train.distill_path")
    eos = set(manifest.get("eos_token_ids") or [])
    docs = []
    for r in records:
        if r.error is not None:
            continue
        ids = r.prompt_token_ids + r.completion_token_ids
        if ids and ids[-1] in eos:
            ids = ids[:-1]
        docs.append(TokenizedDocument(r.prompt + r.completion, tuple(ids), manifest["tokenizer_sha256"]))
    if not docs:
        raise ValueError(f"train.distill_path={path}: no record has a completion "
                         "(every prompt failed to generate)")
    return docs


def _distill_index(name: str) -> int | None:
    """N of a source named "distill.N" (folder N of the train.distill_path list), else None."""
    head, dot, n = name.partition(".")
    return int(n) if head == "distill" and dot and n.isdigit() else None


def _paths(value) -> list:
    """`train.distill_path` as a list of folders: one folder, or a list (or tuple) of them.

    Raises:
        ValueError: anything else (e.g. a number), naming the key.
    """
    if isinstance(value, (str, os.PathLike)):
        return [value]
    paths = list(value) if hasattr(value, "__iter__") else None
    if paths is None or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise ValueError(f"train.distill_path={value!r}: give a mode=distill folder or a list of them, "
                         "e.g. train.distill_path=[DIR0,DIR1]")
    return paths


def load_documents(
    specs: Sequence[SourceSpec], *, gsm8k_path: str | os.PathLike | None = None,
    stdlib_max_bytes: int | None = None, distill_path=None,
) -> dict[str, list[Document]]:
    """Documents of every source in `specs`, keyed by source name (in `specs` order). `distill_path`:
    a mode=distill folder, or a sequence of them whose documents are concatenated in order.

    Raises:
        ValueError: "gsm8k" is requested but `gsm8k_path` is not set, or "distill" without
            `distill_path`, "distill.N" without an N-th folder; and whatever the readers raise.
    """
    docs: dict[str, list[str]] = {}
    for spec in specs:
        if spec.name == "gsm8k":
            if not gsm8k_path:
                raise ValueError("data source 'gsm8k' needs train.gsm8k_path=/path/to/gsm8k/train.jsonl "
                                 "(GSM8K's train split)")
            docs["gsm8k"] = read_gsm8k(gsm8k_path)
        elif spec.name == "stdlib":
            docs["stdlib"] = read_stdlib(stdlib_max_bytes)
        elif spec.name == "distill":
            if not distill_path:
                raise ValueError("data source 'distill' needs train.distill_path: the folder mode=distill "
                                 "wrote (distill.out_dir)")
            docs["distill"] = [d for p in _paths(distill_path) for d in read_distill(p)]
        elif _distill_index(spec.name) is not None:
            paths, n = _paths(distill_path or []), _distill_index(spec.name)
            if n >= len(paths):
                raise ValueError(f"data source {spec.name!r} is folder {n} of train.distill_path, which "
                                 f"lists {len(paths)}: list the folders, e.g. train.distill_path=[DIR0,DIR1]")
            docs[spec.name] = read_distill(paths[n])
        else:  # parse_data_sources already rejects these
            raise ValueError(f"unknown data source {spec.name!r}")
    return docs


def split_documents(docs: Sequence[Document], val_fraction: float,
                    seed: int) -> tuple[list[Document], list[Document]]:
    """Split documents into (train, val) by a seeded shuffle; at least one val document whenever
    there are two or more documents. The order inside each part is the original order.

    Raises:
        ValueError: val_fraction is outside [0, 1).
    """
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction} must be in [0, 1): "
                         "e.g. 0.05 keeps 5% of documents for validation")
    n = len(docs)
    n_val = 0 if n < 2 or val_fraction == 0 else max(1, round(n * val_fraction))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    val_idx = set(perm[:n_val])
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    val = [d for i, d in enumerate(docs) if i in val_idx]
    return train, val


# --------------------------------------------------------------------------------------------------
# tokenize + pack


def pack_documents(token_lists: Sequence[Sequence[int]], eos_id: int, seq_len: int) -> torch.Tensor:
    """Concatenate documents, each followed by `eos_id`, and cut into blocks of `seq_len` tokens.

    The last partial block is dropped. A block may span several documents; the model sees the eos
    between them, as in GPT-2 / nanoGPT pretraining.

    Returns:
        LongTensor [N, seq_len] (N may be 0 when the corpus is shorter than one block).

    Raises:
        ValueError: seq_len < 2.
    """
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len} must be >= 2 (a block needs an input and a target)")
    total = sum(len(t) + 1 for t in token_lists)
    stream = torch.empty(total, dtype=torch.long)
    i = 0
    for t in token_lists:
        stream[i : i + len(t)] = torch.as_tensor(t, dtype=torch.long)
        stream[i + len(t)] = eos_id
        i += len(t) + 1
    n = total // seq_len
    return stream[: n * seq_len].view(n, seq_len)


@dataclass
class PackedCorpus:
    """Packed blocks of several sources, with their mixing weights.

    blocks:    LongTensor [N, seq_len], all sources stacked in `sources` order
    source_id: LongTensor [N], index into `sources` of each block
    sources:   source names
    weights:   mixing weight per source (relative probability of a batch row)
    """

    blocks: torch.Tensor
    source_id: torch.Tensor
    sources: list[str]
    weights: list[float]

    @property
    def seq_len(self) -> int:
        return self.blocks.shape[1]

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def num_tokens(self) -> dict[str, int]:
        """Tokens per source (blocks x seq_len)."""
        return {s: int((self.source_id == k).sum()) * self.seq_len for k, s in enumerate(self.sources)}

    def block_probs(self) -> torch.Tensor:
        """FloatTensor [N] float64: sampling probability of each block (weight_k / N_k, normalized).
        A source without any block gets no probability; the others are renormalized."""
        counts = torch.bincount(self.source_id, minlength=len(self.sources)).double()
        w = torch.tensor(self.weights, dtype=torch.float64)
        per_block = torch.where(counts > 0, w / counts.clamp(min=1), 0.0)
        p = per_block[self.source_id]
        return p / p.sum()


def encode_documents(tokenizer: Tokenizer, docs: Sequence[Document]) -> list[Sequence[int]]:
    """Token ids of each document: a TokenizedDocument's own ids when they belong to `tokenizer`
    (equal tokenizer_sha256), else the encoding of its text."""
    from mtpx.train.tokenizer import tokenizer_sha256

    sha = tokenizer_sha256(tokenizer) if any(isinstance(d, TokenizedDocument) for d in docs) else None
    texts = [i for i, d in enumerate(docs)
             if not (isinstance(d, TokenizedDocument) and d.tokenizer_sha256 == sha)]
    encoded = dict(zip(texts, encode_batch(tokenizer, [doc_text(docs[i]) for i in texts])))
    return [encoded[i] if i in encoded else docs[i].token_ids for i in range(len(docs))]


def pack_corpus(
    docs: dict[str, list[Document]], weights: dict[str, float], tokenizer: Tokenizer, seq_len: int
) -> PackedCorpus:
    """Tokenize (`encode_documents`) and pack each source separately (so mixing weights apply per
    source).

    Args:
        docs: source name -> documents.
        weights: source name -> mixing weight.
        tokenizer: encodes documents; its `<|endoftext|>` ends each one.
        seq_len: tokens per block.

    Returns:
        PackedCorpus; may have 0 blocks if every source is shorter than one block (callers check).
    """
    eos = eos_token_id(tokenizer)
    blocks, ids = [], []
    sources = list(docs)
    for k, name in enumerate(sources):
        b = pack_documents(encode_documents(tokenizer, docs[name]), eos, seq_len)
        blocks.append(b)
        ids.append(torch.full((b.shape[0],), k, dtype=torch.long))
    return PackedCorpus(
        blocks=torch.cat(blocks) if blocks else torch.empty(0, seq_len, dtype=torch.long),
        source_id=torch.cat(ids) if ids else torch.empty(0, dtype=torch.long),
        sources=sources,
        weights=[float(weights[s]) for s in sources],
    )


# --------------------------------------------------------------------------------------------------
# batches


class BatchSampler:
    """Deterministic training batches: `batch(step)` depends only on (seed, step).

    Args:
        corpus: the packed training corpus (at least one block).
        batch_size: rows per batch.
        seed: non-negative int.

    Raises:
        ValueError: empty corpus, batch_size < 1, negative seed.
    """

    def __init__(self, corpus: PackedCorpus, batch_size: int, seed: int):
        if len(corpus) == 0:
            raise ValueError(
                f"the training corpus has no block of seq_len={corpus.seq_len} tokens: "
                "add data or lower train.seq_len"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0")
        self.corpus, self.batch_size, self.seed = corpus, batch_size, seed
        self.probs = corpus.block_probs()  # [N] float64

    def batch(self, step: int) -> torch.Tensor:
        """LongTensor [batch_size, seq_len]: the batch of optimizer step `step` (0-based)."""
        g = torch.Generator().manual_seed((self.seed << 32) + step)
        idx = torch.multinomial(self.probs, self.batch_size, replacement=True, generator=g)
        return self.corpus.blocks[idx]

    def iterate(self, start_step: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (step, batch) for step = start_step, start_step + 1, ... forever; start_step > 0
        resumes exactly where an earlier run stopped."""
        step = start_step
        while True:
            yield step, self.batch(step)
            step += 1


def val_batches(corpus: PackedCorpus, batch_size: int, num_batches: int) -> list[torch.Tensor]:
    """A fixed list of `num_batches` LongTensors [batch_size, seq_len] for validation: the val blocks
    in order (cycled when there are fewer than num_batches * batch_size), so every evaluation scores
    the same tokens and val curves are comparable across steps and runs.

    Raises:
        ValueError: the val corpus has no block.
    """
    if len(corpus) == 0:
        raise ValueError(
            f"the validation corpus has no block of seq_len={corpus.seq_len} tokens: "
            "raise train.val_fraction, add data or lower train.seq_len"
        )
    n = num_batches * batch_size
    idx = torch.arange(n) % len(corpus)
    return list(corpus.blocks[idx].view(num_batches, batch_size, corpus.seq_len).unbind(0))
