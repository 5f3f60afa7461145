"""The vLLM backend against a fake ``vllm`` package (fake_vllm.py): token ids and log-probs in the Rollout,
sleep / wake / weight push order, server mode over HTTP, and the error when vllm is missing."""

from __future__ import annotations

import sys
import threading
import time

import fake_vllm
import pytest
import torch

from grouprl.errors import ConfigError
from grouprl.rollout import SamplingParams, make_backend
from grouprl.rollout.vllm_backend import EngineError, VLLMBackend


def _model_and_tokenizer(path):
    from grouprl.models import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(str(path), "cpu"), load_tokenizer(str(path))


def _trainer_logp(model, out, temperature=1.0):
    from grouprl.train.engine.step import completion_logps

    with torch.no_grad():
        logp, _ = completion_logps(model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask,
                                   temperature)
    return logp


def test_colocate_rollout_carries_the_engines_ids_and_logprobs(tiny_model_dir, monkeypatch):
    fake_vllm.install(monkeypatch, offset=-0.25)
    model, tok = _model_and_tokenizer(tiny_model_dir)
    backend = make_backend("vllm", model, tok, vllm_options={"mode": "colocate", "gpu_memory_utilization": 0.4,
                                                             "sleep": True, "max_model_len": 96})
    llm = fake_vllm.INSTANCES[0]
    assert llm.kwargs["model"] == str(tiny_model_dir) and llm.kwargs["enable_sleep_mode"] is True
    assert llm.kwargs["gpu_memory_utilization"] == 0.4 and llm.kwargs["max_model_len"] == 96
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"  # log-probs after temperature
    out = backend.generate(["What is 1 + 2?", "Hi"], 3, SamplingParams(max_new_tokens=6, temperature=0.8))
    assert len(out) == 6 and out.rollout_logp.shape == out.completion_ids.shape
    # the ids are the engine's (never re-tokenized from text): the decoded text round-trips to them
    rows = out.token_lists()
    assert out.completions == tok.batch_decode(rows, skip_special_tokens=True)
    assert ((out.rollout_logp != 0) == (out.completion_mask == 1)).all()
    # the fake engine reports its copy's log-probs - 0.25; the weights were pushed first, so they are the trainer's
    diff = (_trainer_logp(model, out, 0.8) - out.rollout_logp) * out.completion_mask
    assert torch.allclose(diff, 0.25 * out.completion_mask.float(), atol=1e-4)
    # engine memory: asleep at start; weights woken and pushed (first generate syncs), KV cache woken, asleep after
    assert [e[0] for e in fake_vllm.EVENTS] == ["sleep", "wake_up", "load_weights", "reset_prefix_cache", "wake_up",
                                                 "generate", "sleep"]
    assert fake_vllm.EVENTS[4] == ("wake_up", ("kv_cache",)) and backend.weight_syncs == 1


def test_sampling_params_reach_the_engine(tiny_model_dir, monkeypatch):
    vllm = fake_vllm.install(monkeypatch)
    from grouprl.rollout.vllm_backend import vllm_sampling_params

    sp = vllm_sampling_params(vllm, SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=0), 4, [1, 3])
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.max_tokens, sp.logprobs) == (4, 0.7, 0.9, -1, 7, 0)
    assert sp.stop_token_ids == [1, 3]
    greedy = vllm_sampling_params(vllm, SamplingParams(max_new_tokens=3, temperature=0.0, top_k=5), 1, [1])
    assert (greedy.temperature, greedy.top_k) == (0.0, -1)


def test_missing_vllm_names_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    model, tok = _model_and_tokenizer(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"pip install 'grouprl\[vllm\]'"):
        make_backend("vllm", model, tok, vllm_options={"mode": "colocate"})


def test_missing_vllm_fails_at_start_up_before_the_model_loads(tiny_model_dir, monkeypatch, tmp_path):
    import grouprl.models as model_loader
    from grouprl import GRPOConfig, GRPOTrainer

    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setattr(model_loader, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    cfg = GRPOConfig(output_dir=str(tmp_path), rollout_backend="vllm", eval_split=None)
    with pytest.raises(ConfigError, match=r"needs the vllm package.*pip install 'grouprl\[vllm\]'"):
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=[{"prompt": "a", "answer": "1"}] * 8)
    GRPOConfig(rollout_backend="vllm", vllm_mode="server").check_names()  # the server's client needs no vllm


def test_config_rejects_what_cannot_work():
    from grouprl import GRPOConfig

    with pytest.raises(ConfigError, match="no mismatch to correct"):
        GRPOConfig(rollout_correction="tis")
    with pytest.raises(ConfigError, match="rollout_mask_band"):
        GRPOConfig(rollout_backend="vllm", rollout_mask_band=[1.1, 2.0])
    with pytest.raises(ConfigError, match="vllm_mode='both' must be one of"):
        GRPOConfig(rollout_backend="vllm", vllm_mode="both")
    with pytest.raises(ConfigError, match="would correct it twice"):
        GRPOConfig(rollout_backend="vllm", algorithm="gspo", gspo_use_engine_logp=True, rollout_correction="tis")
    with pytest.raises(ConfigError, match="only the sequence-level losses"):
        GRPOConfig(rollout_backend="vllm", vllm_mode="server", gspo_use_engine_logp=True).check_names()
    with pytest.raises(ConfigError, match="use_peft=true is not supported yet"):
        GRPOConfig(rollout_backend="vllm", use_peft=True)


# ---- server mode: `grouprl vllm-serve` with the fake engine, in a thread --------------------------------
@pytest.fixture
def served(tiny_model_dir, monkeypatch):
    from grouprl.cmd.vllm_serve import make_server

    vllm = fake_vllm.install(monkeypatch, offset=-1.0)
    llm = vllm.LLM(model=str(tiny_model_dir))
    server = make_server(llm, vllm, "127.0.0.1", 0, model=str(tiny_model_dir))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield llm, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_server_mode_pushes_weights_and_returns_ids_and_logprobs(tiny_model_dir, served, monkeypatch):
    llm, url = served
    model, tok = _model_and_tokenizer(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # the trainer moved: the server's copy is now stale
    monkeypatch.setitem(sys.modules, "vllm", None)  # the trainer's side needs no vllm in server mode
    backend = VLLMBackend(model, tok, mode="server", server_url=url, timeout=30)
    backend.sync_weights(model)
    served_params = dict(llm.model.hf.named_parameters())
    assert all(torch.equal(served_params[k], p) for k, p in model.named_parameters())
    out = backend.generate(["What is 2 + 2?"], 2, SamplingParams(max_new_tokens=5, temperature=1.0))
    diff = (_trainer_logp(model, out) - out.rollout_logp) * out.completion_mask
    assert torch.allclose(diff, out.completion_mask.float(), atol=1e-4)  # the engine's offset of -1 nat
    assert [e[0] for e in fake_vllm.EVENTS] == ["load_weights", "reset_prefix_cache", "generate"]


def test_server_errors_come_back_with_the_servers_message(tiny_model_dir, served):
    _, url = served
    model, tok = _model_and_tokenizer(tiny_model_dir)
    backend = VLLMBackend(model, tok, mode="server", server_url=url, timeout=30)
    with pytest.raises(EngineError, match="answered 500: KeyError"):
        backend.engine.load_weights([("no.such.weight", torch.zeros(2))])


def test_no_server_fails_within_the_timeout(tiny_model_dir):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model, tok = _model_and_tokenizer(tiny_model_dir)
    start = time.monotonic()
    with pytest.raises(EngineError, match=rf"no vLLM server answered at http://127.0.0.1:{port}.*grouprl vllm-serve"):
        VLLMBackend(model, tok, mode="server", server_url=f"http://127.0.0.1:{port}", timeout=1.5)
    assert time.monotonic() - start < 10


def test_vllm_serve_cli_without_vllm_names_the_extra(monkeypatch, capsys):
    from grouprl.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)
    assert main(["vllm-serve", "builtin:tiny"]) == 2
    assert "pip install 'grouprl[vllm]'" in capsys.readouterr().err


def _vllm_installed() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(_vllm_installed(), reason="the installed vllm package wins over a namespace folder")
def test_a_folder_named_vllm_is_not_the_package(tmp_path, monkeypatch):
    """A directory ``vllm/`` on sys.path (like this test folder) imports as a namespace package: not vLLM."""
    from grouprl import GRPOConfig
    from grouprl.rollout.vllm_backend import require_vllm

    (tmp_path / "vllm").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'grouprl\[vllm\]'"):
        GRPOConfig(rollout_backend="vllm").check_names()
    with pytest.raises(ConfigError, match=r"is not the vLLM package.*pip install 'grouprl\[vllm\]'"):
        require_vllm()


def test_moving_the_server_is_a_safe_change_on_resume():
    from grouprl import GRPOConfig
    from grouprl.run.resume_config import compare, config_record

    saved = config_record(GRPOConfig(rollout_backend="vllm", vllm_mode="server"))
    safe, unsafe = compare(saved, GRPOConfig(rollout_backend="vllm", vllm_mode="server",
                                             vllm_server_url="http://10.0.0.2:8000", rollout_correction="mask"))
    assert safe == {"vllm_server_url": ["http://127.0.0.1:8000", "http://10.0.0.2:8000"]}
    assert list(unsafe) == ["rollout_correction"]  # another objective: refused


def test_colocate_without_sleep_never_sleeps(tiny_model_dir, monkeypatch):
    fake_vllm.install(monkeypatch)
    model, tok = _model_and_tokenizer(tiny_model_dir)
    backend = make_backend("vllm", model, tok, vllm_options={"mode": "colocate", "sleep": False})
    backend.sync_weights(model)
    backend.generate(["Hi"], 2, SamplingParams(max_new_tokens=3))
    assert [e[0] for e in fake_vllm.EVENTS] == ["load_weights", "reset_prefix_cache", "generate"]
    assert fake_vllm.INSTANCES[0].kwargs["enable_sleep_mode"] is False


def test_a_model_without_a_path_and_a_short_engine_answer_are_named(tiny_model_dir, monkeypatch):
    fake_vllm.install(monkeypatch)
    model, tok = _model_and_tokenizer(tiny_model_dir)
    model.name_or_path = ""
    model.config._name_or_path = ""
    with pytest.raises(ConfigError, match="save it with save_pretrained"):
        make_backend("vllm", model, tok, vllm_options={"mode": "colocate"})

    class Short:
        def load_weights(self, named):
            list(named)

        def generate(self, prompt_ids, n, params, eos_ids):
            return [[{"token_ids": [5], "logprobs": [-1.0]}]]  # one completion where n were asked

    backend = VLLMBackend(model, tok, engine=Short())
    with pytest.raises(EngineError, match=r"returned 1 completions for 1 prompts x n=2"):
        backend.generate(["Hi"], 2, SamplingParams(max_new_tokens=3))
