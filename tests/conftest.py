import os

import pytest
import torch

from tests.helpers import peaked_model, tiny_config, train_tiny

# engine.compile=null means eager in the tests, their subprocesses included (tests about
# compilation pass compile=True; tests of the rule unset this)
os.environ["MTPX_COMPILE"] = "0"

# Under pytest-xdist (README: `python -m pytest -q -n 2`) each worker is one of as many processes
# as cores: torch's default of one thread per core would oversubscribe the machine (its OpenMP
# threads then wait on each other, and a step can run many times slower). So a worker computes on
# one thread, and so does everything it starts: OMP_NUM_THREADS=1 is inherited by the tests'
# subprocesses, and the CLI's thread choice (mtpx.engine.threads) takes it instead of measuring.
# tests/test_threads.py unsets it where it tests that rule.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread_per_worker():
    """Under xdist: a test that set torch's thread count (an explicit eval.threads, a thread
    measurement) does not leave it for the worker's next tests."""
    yield
    if XDIST_WORKER and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture
def tiny_model():
    return peaked_model(tiny_config())


@pytest.fixture(scope="session")
def trained_tiny():
    return train_tiny()


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A tiny random checkpoint folder with a real byte-level BPE tokenizer (vocab 300)."""
    from mtpx.train.checkpoint import save_checkpoint
    from mtpx.train.tokenizer import train_tokenizer
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    tok = train_tokenizer(["def f(x):\n    return x + 1\n" * 50, "Question: what?\nAnswer: 42\n" * 50], 300)
    model = peaked_model(tiny_config(vocab_size=tok.get_vocab_size(), max_position_embeddings=1024)).float()
    save_checkpoint(path, model, tok)
    return path


@pytest.fixture(autouse=True, scope="session")
def _step_cost_cache(tmp_path_factory):
    """Start-up calibrations of num_speculative_tokens=auto are cached under MTPX_CACHE_DIR
    (mtpx.engine.llm.LLM): the suite's go to a folder of its own, not the user's cache."""
    os.environ["MTPX_CACHE_DIR"] = str(tmp_path_factory.mktemp("mtpx_cache"))
