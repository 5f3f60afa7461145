"""``bf16: true`` on a CPU: detection of native bf16 (AVX512-BF16 / AMX-BF16), autocast of the training,
old-log-prob and reference passes with fp32 log-probs, loss and master weights, no autocast for generation,
``ref_dtype`` / ``rollout_dtype`` ``auto`` following it, and the old fp32 fallback where bf16 is not native.

The tests make the detection answer yes or no (monkeypatch), so they run the same on any CPU: autocast on
a CPU without the instructions is slower but computes the same numbers."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from train_helpers import char_reward, train_records

from grouprl.train.engine import precision
from grouprl.train.engine.model import Reference, reference_dtype
from grouprl.train.engine.precision import (
    Autocast,
    autocast_factory,
    cpu_flags,
    generation_context,
    resolve_rollout_dtype,
)
from grouprl.train.engine.step import completion_logps

CPU = torch.device("cpu")
X86_BF16 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
X86_AMX = "flags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n"
X86_PLAIN = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"


@pytest.fixture
def bf16_cpu(monkeypatch):
    """Make this CPU report native bf16 (True) or not (False)."""
    def make(supported: bool):
        monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: supported)
    return make


# ---- detection ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, fast", [(X86_BF16, True), (X86_AMX, True), (X86_PLAIN, False)])
def test_cpu_flags_and_detection(tmp_path, monkeypatch, text, fast):
    info = tmp_path / "cpuinfo"
    info.write_text(text + "\nprocessor\t: 1\nflags\t\t: fpu\n")  # the first CPU's flags are read
    assert ("avx512f" in cpu_flags(info)) is ("avx512f" in text)
    monkeypatch.setattr(precision, "cpu_flags", lambda: cpu_flags(info))
    precision.cpu_has_fast_bf16.cache_clear()
    try:
        assert precision.cpu_has_fast_bf16() is fast
    finally:
        precision.cpu_has_fast_bf16.cache_clear()


def test_cpu_flags_of_a_missing_or_flagless_file_are_empty(tmp_path):
    assert cpu_flags(tmp_path / "absent") == frozenset()
    (tmp_path / "arm").write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")
    assert cpu_flags(tmp_path / "arm") == frozenset()
    (tmp_path / "aarch64").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(tmp_path / "aarch64") == {"fp", "asimd", "bf16"}  # read, but not in BF16_CPU_FLAGS
    assert not precision.BF16_CPU_FLAGS & cpu_flags(tmp_path / "aarch64")


# ---- the autocast factory ----------------------------------------------------------------------
def test_bf16_on_a_bf16_cpu_autocasts_training_but_not_generation(bf16_cpu):
    bf16_cpu(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # supported: no fallback warning
        autocast = autocast_factory(True, CPU)
    assert isinstance(autocast, Autocast)
    with autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with generation_context(autocast):
        assert not torch.is_autocast_enabled("cpu")
    with generation_context(contextlib.nullcontext):  # any plain factory still works
        assert not torch.is_autocast_enabled("cpu")
    assert autocast_factory(False, CPU) is contextlib.nullcontext  # the default stays fp32


def test_bf16_on_a_cpu_without_native_bf16_warns_and_stays_fp32(bf16_cpu):
    bf16_cpu(False)
    with pytest.warns(UserWarning, match="no fast bf16 support: training in fp32 instead"):
        autocast = autocast_factory(True, CPU)
    assert autocast is contextlib.nullcontext
    assert reference_dtype("auto", CPU, bf16=True) == torch.float32


def test_ref_dtype_auto_follows_cpu_autocast(bf16_cpu):
    bf16_cpu(True)
    assert reference_dtype("auto", CPU, bf16=True) == torch.bfloat16
    assert reference_dtype("auto", CPU, bf16=False) == torch.float32  # an fp32 run keeps an fp32 reference
    assert reference_dtype("float32", CPU, bf16=True) == torch.float32  # a name always wins
    policy = _model()
    assert next(Reference(policy, "auto", bf16=True).model.parameters()).dtype == torch.bfloat16
    assert next(Reference(policy, "auto", bf16=False).model.parameters()).dtype == torch.float32


def test_rollout_dtype_auto_follows_cpu_autocast_where_the_lean_sampler_runs(bf16_cpu):
    from grouprl.config import GRPOConfig

    model = _model()
    bf16_cpu(True)
    assert resolve_rollout_dtype(GRPOConfig(bf16=True), model) == "bfloat16"
    assert resolve_rollout_dtype(GRPOConfig(bf16=False), model) == "float32"
    assert resolve_rollout_dtype(GRPOConfig(bf16=True, rollout_dtype="float32"), model) == "float32"
    assert resolve_rollout_dtype(GRPOConfig(bf16=True, lean_sampler=False), model) == "float32"
    assert resolve_rollout_dtype(GRPOConfig(bf16=True, environment="calculator"), model) == "float32"
    assert resolve_rollout_dtype(GRPOConfig(bf16=True, algorithm="ppo"), model) == "float32"
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(_model(), LoraConfig(r=4, target_modules="all-linear"))
    assert resolve_rollout_dtype(GRPOConfig(bf16=True, use_peft=True), lora) == "float32"  # no lean sampler
    bf16_cpu(False)
    assert resolve_rollout_dtype(GRPOConfig(bf16=True), model) == "float32"
    assert resolve_rollout_dtype(GRPOConfig(bf16=False, rollout_dtype="bfloat16"), model) == "bfloat16"


# ---- numerics of the autocast policy pass -------------------------------------------------------
def _model():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def _batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    pm = torch.ones(4, 5, dtype=torch.long)
    pm[1, :3] = 0  # left padding
    cm = torch.ones(4, 6, dtype=torch.long)
    cm[2, 2:] = 0  # a short completion
    return torch.randint(3, vocab, (4, 5), generator=g) * pm, pm, torch.randint(3, vocab, (4, 6), generator=g) * cm, cm


def _pass(model, ctx, **kw):
    """Log-probs (T = 0.7) and the gradient of their masked sum."""
    p, pm, c, cm = _batch(model.config.vocab_size)
    model.zero_grad(set_to_none=True)
    with ctx:
        logp, entropy = completion_logps(model, p, pm, c, cm, 0.7, with_entropy=True, **kw)
    (logp * cm).sum().backward()
    return logp.detach(), entropy, {n: q.grad.clone() for n, q in model.named_parameters()}, cm.bool()


def test_policy_pass_runs_under_autocast_with_fp32_logps_and_gradients(tiny_model_dir, bf16_cpu):
    from transformers import AutoModelForCausalLM

    bf16_cpu(True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    seen = []
    model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda m, a, out: seen.append((torch.is_autocast_enabled("cpu"), out.dtype)))
    logp, entropy, grads, mask = _pass(model, autocast_factory(True, CPU)(), chunk_size=3)
    assert seen == [(True, torch.bfloat16)]  # the decoder's matmuls ran in bf16 ...
    assert logp.dtype == entropy.dtype == torch.float32  # ... the log-softmax in fp32
    assert all(g.dtype == torch.float32 for g in grads.values())  # fp32 master weights get fp32 gradients
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_bf16_logps_and_gradients_are_close_to_fp32_and_the_chunked_head_matches_the_plain_path(tiny_model_dir):
    """Tiny Qwen2 (vocabulary 373, hidden 64, tied head), T = 0.7. Measured: log-prob error 2.2e-3 max
    (log-probs near -6), gradient error 1.7e-2 of the gradient's norm (worst parameter); the chunked head's
    hand-written backward under autocast agrees with autograd through the plain head under autocast to
    5e-7 (log-probs) and 1.4e-3 (gradients: bf16 rounding in different places)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lp32, _, g32, mask = _pass(model, contextlib.nullcontext(), plain=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    lp_chunk, _, g_chunk, _ = _pass(model, autocast, chunk_size=3)
    lp_plain, _, g_plain, _ = _pass(model, torch.autocast("cpu", dtype=torch.bfloat16), plain=True)

    def rel(a, b):
        return max(float((a[n] - b[n]).norm() / b[n].norm()) for n in b)

    err = float((lp_chunk - lp32)[mask].abs().max())
    assert 1e-4 < err < 1e-2  # bf16 did change the numbers, by bf16 rounding only
    assert float((lp_chunk - lp_plain)[mask].abs().max()) < 1e-5
    assert rel(g_chunk, g32) < 5e-2
    assert rel(g_chunk, g_plain) < 5e-3


# ---- whole runs -------------------------------------------------------------------------------------
def _train(tiny_model_dir, train_rows, cfg):
    from grouprl import GRPOTrainer

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward)
        trainer.train()
    return trainer, [str(w.message) for w in caught if "bf16" in str(w.message)]


def test_grpo_steps_train_in_bf16_on_a_bf16_cpu(tiny_model_dir, train_rows, fast_config, bf16_cpu, monkeypatch):
    from grouprl.train.algorithms import grpo as loop

    bf16_cpu(True)
    refs = []
    prepare = loop.prepare_model
    monkeypatch.setattr(loop, "prepare_model", lambda *a: refs.append(prepare(*a)) or refs[-1])
    cfg = fast_config(bf16=True, kl_coef=0.04, max_steps=3)
    trainer, warned = _train(tiny_model_dir, train_rows, cfg)
    assert warned == []
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # fp32 master weights
    autocast, reference = refs[0]
    assert isinstance(autocast, Autocast) and next(reference.model.parameters()).dtype == torch.bfloat16
    records = train_records(cfg.output_dir)
    assert len(records) == 3
    for rec in records:
        assert all(torch.isfinite(torch.tensor(rec[k])) for k in ("loss/total", "kl", "grad_norm"))
        # rollout_dtype auto -> bf16 sampler: its log-probs differ from the trainer's by bf16 rounding only
        assert 0 < rec["mismatch/logp_abs_diff"] < 0.05 and rec["mismatch/is_weight_max"] <= 2.0


def test_bf16_on_a_cpu_without_native_bf16_trains_in_fp32_with_one_warning(tiny_model_dir, train_rows, fast_config,
                                                                           bf16_cpu):
    bf16_cpu(False)
    cfg = fast_config(bf16=True, max_steps=1)
    trainer, warned = _train(tiny_model_dir, train_rows, cfg)
    assert len(warned) == 1 and "training in fp32 instead" in warned[0]
    (rec,) = train_records(cfg.output_dir)
    assert not [k for k in rec if k.startswith("mismatch/")]  # fp32 sampler: the trainer's own weights



def test_ppo_and_dpo_steps_run_under_cpu_autocast(tiny_model_dir, train_rows, tmp_path, bf16_cpu):
    """The other two loops take the same autocast factory: PPO's critic values and DPO's log-probs stay fp32
    (``critic_values`` / ``completion_logps`` upcast), the losses are finite, the weights stay fp32."""
    import json

    from grouprl import GRPOConfig, GRPOTrainer
    from grouprl.cli import main

    bf16_cpu(True)
    ppo = GRPOConfig(algorithm="ppo", output_dir=str(tmp_path / "ppo"), num_generations=1, per_device_train_batch_size=4,
                     gradient_accumulation_steps=1, max_new_tokens=6, max_prompt_length=64, max_steps=1, kl_coef=0.1,
                     progress_bar=False, save_strategy="no", seed=0, eval_split=None, bf16=True)
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=ppo, train_dataset=train_rows, reward_funcs=char_reward)
    trainer.train()
    (rec,) = train_records(ppo.output_dir)
    assert all(torch.isfinite(torch.tensor(rec[k])) for k in ("loss/policy", "loss/value", "value/mean"))
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())

    data = tmp_path / "pairs"
    data.mkdir()
    pairs = [{"prompt": f"What is {i} + 1?", "chosen": f"Answer: {i + 1}", "rejected": f"Answer: {i + 2}"}
             for i in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    out = tmp_path / "dpo"
    assert main(["train", f"model={tiny_model_dir}", f"dataset={data}", f"output_dir={out}", "algorithm=dpo",
                 "max_steps=2", "per_device_train_batch_size=2", "gradient_accumulation_steps=1", "max_new_tokens=4",
                 "progress_bar=false", "save_strategy=no", "eval_split=null", "bf16=true"]) == 0
    records = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(records) == 2 and all(torch.isfinite(torch.tensor([r["loss"], r["grad_norm"]])).all() for r in records)


def test_an_explicit_correction_is_accepted_with_bf16_and_rollout_dtype_auto():
    """With ``bf16`` and ``rollout_dtype: auto`` the sampler may be a bf16 copy (resolved at start-up), so
    ``rollout_correction: tis`` is no longer refused up front; an fp32 run still is."""
    from grouprl.config import GRPOConfig
    from grouprl.errors import ConfigError

    assert GRPOConfig(bf16=True, rollout_correction="tis").rollout_correction == "tis"
    with pytest.raises(ConfigError, match="no mismatch to correct"):
        GRPOConfig(rollout_correction="tis")
    with pytest.raises(ConfigError, match="no mismatch to correct"):
        GRPOConfig(bf16=True, rollout_dtype="float32", rollout_correction="mask")
