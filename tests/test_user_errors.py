"""Faults after the config is read end in one line naming the key and the fix, not a traceback:
a full disk at a training save (the previous checkpoint kept), unwritable run / logger / distill
folders, train.device=cuda without CUDA, an unknown compile backend, a Hugging Face config with a
number written as a string (issue 41 item 3)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
ENOSPC_TEXT = 'Error while serializing: I/O error: No space left on device (os error 28) at path "x"'


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train_or_eval.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def test_full_disk_at_a_training_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch,
                                                                                     capsys):
    """safetensors reports ENOSPC as a SafetensorError (not an OSError): the save's second
    checkpoint fails, the run prints one line naming the folder and the fix, exits 2, and the
    first checkpoint is intact, byte for byte."""
    from mtpx.cli import _dispatch
    from tests.test_train import run_cfg, write_synthetic_gsm8k
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl")
    cfg = OmegaConf.create({**run_cfg(tmp_path, "out", steps=6, save_every=3, eval_every=0), "mode": "train",
                            "logger": {"name": "none"}, "seed": 0})
    real, calls, kept = safetensors.torch.save_file, [], {}

    def save_file(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) > 2:                       # the first save (weights + optimizer) succeeds
            if not kept:
                kept.update({p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()})
            raise safetensors.SafetensorError(ENOSPC_TEXT)
        return real(tensors, path, metadata=metadata)
    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    assert _dispatch(cfg) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("error", "Traceback"))]
    assert len(err) == 1 and err[0].startswith(f"error: no space left to write {tmp_path / 'out'}")
    assert "the previous one is kept" in err[0] and "free disk space" in err[0]
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == kept
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gsm8k.jsonl", "out"]   # no temporary folder left


def test_disk_error_line_reads_oserrors_and_safetensors_errors():
    import errno

    from mtpx.io import disk_error_line
    assert disk_error_line(safetensors.SafetensorError(ENOSPC_TEXT)).startswith(
        "No space left on device: free")
    assert "(/x): point the output at a folder you can write" in disk_error_line(
        PermissionError(errno.EACCES, "Permission denied", "/x"))
    assert disk_error_line(ValueError("no")) is None and disk_error_line(OSError(errno.EIO, "io")) is None


def test_hydra_run_dir_under_proc_is_one_line(tmp_path):
    from mtpx.cli import check_run_dirs
    assert check_run_dirs(["hydra.run.dir=" + str(tmp_path / "a" / "${now:%H}")]) is None
    line = check_run_dirs(["hydra.run.dir=/proc/mtpx/${now:%H}"])
    assert line.startswith("hydra.run.dir=/proc/mtpx/${now:%H} cannot be created or written")
    assert line.endswith("point hydra.run.dir at a folder you can write")
    assert check_run_dirs(["-m", "hydra.sweep.dir=/proc/m"]).startswith("hydra.sweep.dir=/proc/m")
    (tmp_path / "file").write_text("")
    assert "Not a directory" in check_run_dirs([f"hydra.run.dir={tmp_path / 'file' / 'run'}"])
    r = _cli(["mode=eval", "hydra.run.dir=/proc/mtpx/run"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: hydra.run.dir=/proc/mtpx/run cannot be created or written (No such file or directory in "
        "/proc): point hydra.run.dir at a folder you can write"]


def test_logger_dir_and_distill_out_dir_unwritable(tmp_path):
    from mtpx.metrics.logging import RunLogger
    with pytest.raises(ValueError,
                       match=r"^logger.dir=/proc/mtpx cannot be created or written .*point logger.dir at"):
        RunLogger({"name": "wandb", "mode": "offline", "dir": "/proc/mtpx"}, run_dir=tmp_path, config={})
    from mtpx.io import check_writable_dir
    with pytest.raises(ValueError, match=r"^distill.out_dir=/proc/x/y cannot be created or written"):
        check_writable_dir("/proc/x/y", "distill.out_dir")
    assert check_writable_dir(tmp_path / "new" / "dir", "distill.out_dir").is_dir()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine can train on cuda")
def test_train_device_cuda_without_cuda_is_one_line():
    from mtpx.train.setup import check_device as _check_device
    with pytest.raises(ValueError,
                       match=r"^train.device=cuda: (this torch build has no CUDA|no CUDA GPU is visible)"):
        _check_device("cuda")
    with pytest.raises(ValueError, match="train.device='gpu' is not a device torch knows"):
        _check_device("gpu")
    _check_device("cpu")


def test_unknown_compile_backend_names_the_key(tiny_ckpt):
    from mtpx import LLM
    from mtpx.engine.config import EngineConfig
    with pytest.raises(ValueError, match=r"^engine.compile_backend='inductr' is not a torch.compile backend: "
                                         r"did you mean inductor\?"):
        EngineConfig(compile_backend="inductr")
    with pytest.raises(ValueError, match="engine.compile_backend='foo'"):
        LLM(model=tiny_ckpt, compile_backend="foo")
    EngineConfig(compile_backend="eager")


def test_hf_config_with_a_number_as_a_string_names_the_key(tmp_path):
    from mtpx.hf.loader import load_config
    d = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100, "hidden_size": "64",
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"config.json: hidden_size='64' must be a number, not str: write it "
                                         r"without quotes \(\"hidden_size\": 64\)"):
        load_config(tmp_path)


# ---- silently wrong before (issue 41 item 4) -------------------------------------------------------


def test_eval_max_tokens_past_the_model_length_warns_and_the_header_shows_the_cap(tiny_ckpt, tmp_path):
    run = tmp_path / "run"
    r = _cli([f"model.path={tiny_ckpt}", "logger=none", "eval.num_prompts=2", "eval.max_tokens=100000",
              "engine.max_model_len=512", "eval.check_lossless=false", f"hydra.run.dir={run}"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    warn = [line for line in r.stderr.splitlines() if line.startswith("warning: eval.max_tokens")]
    assert len(warn) == 1 and "exceeds max_model_len=512 (prompt + output) for 2 of 2 prompts" in warn[0]
    cap = int(warn[0].split("they stop at ")[1].split()[0])
    header = " ".join((run / "report.txt").read_text().split())        # the title is wrapped
    assert f"max_tokens 100000 (capped to {cap} by max_model_len)" in header
    assert "UserWarning" not in r.stderr


def test_empty_model_path_is_an_error_not_the_demo():
    from mtpx.engine.llm import DEFAULT_MODEL
    from mtpx.evaluate import model_path
    assert model_path(OmegaConf.create({"model": {"path": None}})) == DEFAULT_MODEL
    with pytest.raises(ValueError, match="^model.path is empty: give a checkpoint folder"):
        model_path(OmegaConf.create({"model": {"path": ""}}))


def _copy_ckpt(src: Path, dst: Path, **config) -> Path:
    import shutil
    shutil.copytree(src, dst)
    d = json.loads((dst / "config.json").read_text())
    d.update(config)
    (dst / "config.json").write_text(json.dumps(d))
    return dst


def test_config_module_count_or_eos_that_disagree_with_the_checkpoint_are_errors(tiny_ckpt, tmp_path):
    from mtpx.hf.loader import CheckpointError, load_pretrained
    n = json.loads((tiny_ckpt / "config.json").read_text())["num_nextn_predict_layers"]
    bad = _copy_ckpt(tiny_ckpt, tmp_path / "mods", num_nextn_predict_layers=n + 1)
    with pytest.raises(CheckpointError,
                       match=rf"declares num_nextn_predict_layers={n + 1} but the weights hold {n} "
                             rf"MTP module\(s\).*set num_nextn_predict_layers to {n}"):
        load_pretrained(bad)
    vocab = json.loads((tiny_ckpt / "config.json").read_text())["vocab_size"]
    bad = _copy_ckpt(tiny_ckpt, tmp_path / "eos", eos_token_id=vocab + 5)
    with pytest.raises(CheckpointError,
                       match=rf"eos_token_id {vocab + 5} is not a token id of the vocabulary "
                             rf"\(0 .. {vocab - 1}\): fix eos_token_id in config.json"):
        load_pretrained(bad)
