"""Thread choice (mtpx/engine/threads.py): explicit setting, OMP_NUM_THREADS, the measured
fastest count within the CPUs allowed, and the contention warning."""
import pytest
import torch

from mtpx.engine import threads as th
from tests.helpers import peaked_model, tiny_config


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_explicit_then_env_then_measured(keep_threads, monkeypatch):
    model = peaked_model(tiny_config())
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    c = th.choose_threads(model, 1, "bench.threads")
    assert (c.threads, c.reason, torch.get_num_threads()) == (1, "bench.threads", 1) and 1 in c.forward_ms
    with pytest.raises(ValueError, match=r"eval.threads=0: must be an integer >= 1, or null"):
        th.choose_threads(model, 0)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert th.choose_threads(model).reason == "OMP_NUM_THREADS"
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(th, "available_cpus", lambda: 2)
    fake = {1: 5.0, 2: 4.8}                 # 2 threads within 10% of 1: the fewer wins
    monkeypatch.setattr(th, "forward_ms", lambda m, n, repeats=5: fake[n])
    c = th.choose_threads(model)
    assert (c.threads, c.reason, c.forward_ms) == (1, "measured fastest", fake)
    fake[2] = 2.0
    assert th.choose_threads(model).threads == 2
    assert ("threads: 2 (measured fastest; 2 CPUs available; forward at 1 x 16 tokens 1: 5.00 ms, 2: 2.00 ms)"
            == th.choose_threads(model).describe())

    monkeypatch.setattr(th, "available_cpus", lambda: 1)
    fake[1] = 3.0
    assert (th.choose_threads(model).describe()
            == "threads: 1 (the only CPU available; forward at 1 x 16 tokens 1: 3.00 ms)")
    assert th.ThreadChoice(1, "eval.threads", 1).describe() == "threads: 1 (eval.threads; 1 CPU available)"


def test_contention_warning_when_the_forward_got_slower(keep_threads, monkeypatch):
    model = peaked_model(tiny_config())
    choice = th.ThreadChoice(1, "eval.threads", 2, {1: 1.0})
    monkeypatch.setattr(th, "forward_ms", lambda m, n, repeats=5: 2.5)
    assert th.contention_warning(model, choice).startswith(
        "warning: the model's forward now takes 2.50 ms, 2.5x its 1.00 ms at start-up with 1 threads")
    monkeypatch.setattr(th, "forward_ms", lambda m, n, repeats=5: 1.2)
    assert th.contention_warning(model, choice) is None


def test_available_cpus_respects_affinity():
    import os
    assert 1 <= th.available_cpus() <= len(os.sched_getaffinity(0))


def test_train_threads_are_chosen_as_evals(keep_threads, monkeypatch):
    """train.threads: an explicit count, then OMP_NUM_THREADS, then a resumed run's count, then
    the measured fastest; torchrun ranks on one node share its CPUs."""
    from omegaconf import OmegaConf

    from mtpx.train import setup
    from mtpx.train.distributed import DistInfo
    model = peaked_model(tiny_config())
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(th, "available_cpus", lambda: 4)
    monkeypatch.setattr(setup, "available_cpus", lambda: 4)
    monkeypatch.setattr(th, "forward_ms", lambda m, n, repeats=5: {1: 9.0, 2: 5.0, 4: 4.9}.get(n, 7.0))
    one = DistInfo()
    c = setup.choose_train_threads(OmegaConf.create({"threads": None}), model, one, None)
    assert (c.threads, c.reason, torch.get_num_threads()) == (2, "measured fastest", 2)
    assert setup.choose_train_threads(OmegaConf.create({"threads": 3}), model, one, 1).threads == 3
    c = setup.choose_train_threads(OmegaConf.create({"threads": None}), model, one, 1)
    assert (c.threads, c.reason) == (1, "the count the resumed run started with")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    c = setup.choose_train_threads(OmegaConf.create({"threads": None}), model,
                                   DistInfo(mode="ddp", world_size=2), None)
    assert (c.threads, c.reason) == (2, "the node's CPUs shared by its 2 ranks")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert (setup.choose_train_threads(OmegaConf.create({"threads": None}), model, one, 2).reason
            == "OMP_NUM_THREADS")
