"""DeepSpeed ZeRO-2 and ZeRO-3 on two gloo ranks train exactly like one process with the same global batch.

The ranks wrap the policy and the optimizer in a ZeRO engine (``grouprl.train.parallel.deepspeed``, through
``Ranks.zero_init`` as the loop does) and take the optimizer steps of ``train.engine.step.accumulate_and_step``; their
gathered parameters are compared with one plain process that sees the whole global batch
(``dist_workers.train_two_steps``). One 2-process launch per stage runs every case.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
from dist_harness import run_ranks, values
from dist_workers import ROWS, explode_on_rank_1, letters, run_config, run_training, train_two_steps

pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra: pip install 'grouprl[deepspeed]'")

CASES = [("token_mean", 1, "sgd"), ("token_mean", 2, "sgd"), ("seq_mean_token_mean", 2, "sgd"),
         ("token_mean", 2, "sgd_clip"), ("token_mean", 2, "adamw"), ("token_mean", "uneven", "sgd"),
         ("token_mean", "nan", "sgd")]


def ds_env(stage: int) -> dict[str, str]:
    """What ``accelerate launch`` with ``distributed_type: DEEPSPEED`` and ``zero_stage: <stage>`` sets."""
    return {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": str(stage),
            "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "none", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none",
            "DS_ACCELERATOR": "cpu"}


def run_env(stage: int, folder: str | None = None) -> dict[str, str]:
    """ZeRO-2: accelerate's variables. ZeRO-3: a DeepSpeed JSON (``deepspeed_config_file``, written into
    ``folder``, the test's own temporary folder) that partitions EVERY parameter
    (``stage3_param_persistence_threshold: 0``; by default DeepSpeed keeps parameters under 1e5 elements --
    most of a tiny model -- whole on every rank)."""
    if stage == 2:
        return ds_env(2)
    path = os.path.join(folder, f"zero3-{os.getpid()}.json")
    with open(path, "w") as f:
        json.dump({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}, f)
    return {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": path, "DS_ACCELERATOR": "cpu"}


def whole_params(model) -> dict[str, torch.Tensor]:
    """Every parameter whole (ZeRO-3 partitions gathered; every rank calls it)."""
    from grouprl.train.parallel import ranks as dist

    with dist.current().sharding.full_weights(model):
        return {k: v.detach().clone() for k, v in model.named_parameters()}


def two_steps(model_dir: str, aggregation: str, ga: Any, optim: str, world: int, rank: int, **kw: Any) -> Any:
    """``train_two_steps`` with ``ga`` = ``'uneven'``: rank 0 takes 2 micro-batches per step, rank 1 one
    (one process: 2); ``'nan'``: 2 micro-batches and a NaN advantage in the first step's rows of the last
    rank, so the first step is skipped (one process: the same rows, the same skip)."""
    import dist_workers

    if ga == "uneven":
        ga = 2 if rank == 0 else 1
    elif ga == "nan":
        ga, saved = 2, dist_workers.ADV.clone()
        dist_workers.ADV[dist_workers.ROWS_PER_STEP - 1] = float("nan")
        try:
            return train_two_steps(model_dir, aggregation, ga, optim, world=world, rank=rank, **kw)
        finally:
            dist_workers.ADV.copy_(saved)
    return train_two_steps(model_dir, aggregation, ga, optim, world=world, rank=rank, **kw)


def zero_two_steps(model_dir: str, aggregation: str, ga: Any, optim: str) -> dict[str, torch.Tensor]:
    from grouprl.train.parallel import ranks as dist

    d = dist.current()
    trained = two_steps(model_dir, aggregation, ga, optim, d.world, d.rank,
                        ready=lambda model, optimizer, cfg: d.zero_init(model, optimizer, cfg))
    return whole_params(trained[None])


def generates_whole(model_dir: str) -> dict:
    """Greedy lean-sampler and ``generate`` completions inside ``Ranks.sharding.full_weights``, rank 0 alone (no
    collective may happen inside), and how many parameter elements this rank holds outside it."""
    from transformers import AutoModelForCausalLM

    from grouprl.config import GRPOConfig
    from grouprl.rollout.lean import lean_sample
    from grouprl.train.parallel import ranks as dist

    d = dist.current()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    d.zero_init(model, torch.optim.SGD(model.parameters(), lr=0.1), GRPOConfig())
    ids = torch.randint(5, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    out = {"local": sum(p.numel() for p in model.parameters())}
    with d.sharding.full_weights(model):
        out["inside"] = sum(p.numel() for p in model.parameters())
        if d.is_main:  # rank 0 alone, as in an evaluation: the other rank is already at the next collective
            out["lean"] = lean_sample(model, ids, torch.ones_like(ids), 2, max_new_tokens=5, temperature=0.0)
            out["generate"] = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                                             do_sample=False)[:, 6:]
    d.check()
    out["after"] = sum(p.numel() for p in model.parameters())
    return out


def all_cases(model_dir: str, stage: int, cases: list, folder: str) -> dict:
    os.environ.update(run_env(stage, folder))
    out: dict = {case: zero_two_steps(model_dir, *case) for case in cases}
    out["generate"] = generates_whole(model_dir)
    return out


@pytest.fixture(scope="module", params=[2, 3])
def zero_ranks(request, tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(f"zero{request.param}")
    results = run_ranks(all_cases, 2, str(tiny_model_dir), request.param, CASES, str(workdir),
                        workdir=workdir, timeout=300)
    return request.param, values(results)


def test_zero_ranks_match_one_process(tiny_model_dir, zero_ranks):
    from transformers import AutoModelForCausalLM

    stage, ranks = zero_ranks
    start = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    for case in CASES:
        one = two_steps(str(tiny_model_dir), *case, 1, 0)
        assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-4, f"{case}: did not train"
        for r, got in enumerate(ranks):
            assert got[case].keys() == one.keys()
            worst = max(float((got[case][k] - one[k]).abs().max()) for k in one)
            assert worst <= (1e-5 if case[2] == "adamw" else 1e-6), f"ZeRO-{stage} {case}: rank {r} differs by {worst:.3g}"


def test_gathered_weights_generate_as_the_plain_model_on_one_rank(tiny_model_dir, zero_ranks):
    """ZeRO-3 partitions every parameter; inside ``full_weights`` they are whole (the lean sampler reads
    them) and rank 0 generates alone; afterwards they are partitions again. ZeRO-2 keeps them whole."""
    from transformers import AutoModelForCausalLM

    from grouprl.rollout.lean import lean_sample

    stage, ranks = zero_ranks
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    full = sum(p.numel() for p in model.parameters())
    r0, r1 = (r["generate"] for r in ranks)
    assert r0["inside"] == full and r1["inside"] == full
    if stage == 3:
        assert r0["local"] == r0["after"] == 0  # placeholders: the data lives in ds_tensor partitions
    else:
        assert r0["local"] == r0["after"] == full
    ids = torch.randint(5, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    expected = lean_sample(model, ids, torch.ones_like(ids), 2, max_new_tokens=5, temperature=0.0)
    assert torch.equal(r0["lean"], expected)
    assert torch.equal(r0["generate"], expected[::2])  # generate: no per-token collective (hooks removed)


# ---- whole GRPOTrainer runs under ZeRO-3 -------------------------------------------------------------
RUN = dict(kl_coef=0.05, eval_steps=2, lean_sampler=False)  # a replicated reference; generate() (the GPU default) on
# gathered weights, rank 0 evaluating alone; a mid-run evaluation


def zero_training(model_dir: str, output_dir: str, resume: str | None = None, stage: int | None = 3) -> dict:
    """One GRPOTrainer run on this rank (DeepSpeed ZeRO-``stage`` unless None): its whole weights and result,
    or the error it stopped with."""
    if stage is not None:
        os.environ.update(run_env(stage, os.path.dirname(output_dir)))
    from grouprl.train import GRPOTrainer

    from grouprl.train.parallel import ranks as dist
    cfg = run_config(model_dir, output_dir, **RUN)
    trainer = GRPOTrainer(config=cfg, train_dataset=list(ROWS), reward_funcs=[letters], eval_dataset=list(ROWS[:3]),
                          eval_reward_func=letters)
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except Exception as e:  # noqa: BLE001 - the refusal test reads it
        return {"error": f"{type(e).__name__}: {e}"}
    d = dist.current()
    params = whole_params(trainer.model)
    return {"params": params, "global_step": result["global_step"], "engine": d.engine is not None,
            "evals": sorted(result["evals"]), "history": result["history"],
            "local": sum(p.numel() for p in trainer.model.parameters())}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def zero3_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("zero3-run") / "out"
    ranks = values(run_ranks(zero_training, 2, str(tiny_model_dir), str(out), workdir=out.parent / "w", timeout=400))
    return out, ranks


def test_zero3_run_checkpoints_and_saves_a_plain_final(tiny_model_dir, zero3_run):
    from transformers import AutoModelForCausalLM

    out, (r0, r1) = zero3_run
    assert r0["engine"] and r1["engine"] and r0["global_step"] == 4
    assert _same(r0["params"], r1["params"])  # the gathered weights agree
    full = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    assert r0["local"] < full  # partitioned outside the gathered blocks
    assert r0["evals"] == ["after", "before", "step2"]  # rank 0 evaluated alone on gathered weights
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and all(r["kl"] == r["kl"] for r in steps)
    ckpt = out / "checkpoint-1"
    assert len(list((ckpt / "deepspeed" / "zero").glob("*optim_states.pt"))) == 2  # one partition per rank
    assert not list(ckpt.glob("*.safetensors")) and (ckpt / "config.json").is_file()
    final = AutoModelForCausalLM.from_pretrained(out / "final", dtype=torch.float32)
    loaded = dict(final.named_parameters())
    assert all(torch.equal(loaded[k], v) for k, v in r0["params"].items())


def test_zero3_checkpoint_resumes_on_two_ranks_bit_exactly(tiny_model_dir, zero3_run, tmp_path):
    """From checkpoint-1, the middle of a generation round (2 optimizer steps per round)."""
    out, (r0, _) = zero3_run
    again = values(run_ranks(zero_training, 2, str(tiny_model_dir), str(tmp_path / "again"),
                             str(out / "checkpoint-1"), workdir=tmp_path / "w", timeout=400))
    assert again[0]["global_step"] == 4
    assert _same(again[0]["params"], r0["params"]) and _same(again[1]["params"], r0["params"])
    assert [h["reward"] for h in again[0]["history"]] == [h["reward"] for h in r0["history"]]


def test_zero3_checkpoint_on_another_rank_count_is_refused_with_the_fix(tiny_model_dir, zero3_run, tmp_path):
    out, _ = zero3_run
    (one,) = values(run_ranks(zero_training, 1, str(tiny_model_dir), str(tmp_path / "one"), str(out / "checkpoint-2"),
                              None, workdir=tmp_path / "w", timeout=200))
    assert "written by 2 ranks" in one["error"] and "zero_to_fp32.py" in one["error"] and "--num_processes 2" in one["error"]


def test_a_reward_raising_on_one_rank_ends_both_in_seconds_under_zero2(tiny_model_dir, tmp_path):
    os.environ.update(ds_env(2))  # inherited by the spawned ranks
    try:
        res = run_ranks(run_training, 2, str(tiny_model_dir), str(tmp_path / "out"), explode_on_rank_1,
                        workdir=tmp_path / "w", timeout=200, collective_timeout=120)
    finally:
        for key in ds_env(2):
            os.environ.pop(key, None)
    r0, r1 = values(res)
    assert "reward exploded on purpose" in r1["error"]
    assert r0["error"].startswith("PeerFailure") and "rank 1" in r0["error"] and "reward exploded" in r0["error"]
    assert abs(r0["end"] - r1["end"]) < 15  # the error flag, not the 120 s collective timeout


# ---- what a DeepSpeed launch accepts and refuses, before any model loads (no processes) ----------------
def _launch_env(monkeypatch, stage: int = 2, **extra: str) -> None:
    for key, value in {**ds_env(stage), "ACCELERATE_MIXED_PRECISION": "no", **extra}.items():
        monkeypatch.setenv(key, value)


def test_batch_fields_come_from_grouprl_and_a_contradiction_names_both(monkeypatch, tmp_path):
    """The default recipe's batch fills DeepSpeed's; a value set to something else in accelerate's config or
    in a DeepSpeed JSON is refused, naming the DeepSpeed field and the grouprl field."""
    from grouprl.config import GRPOConfig
    from grouprl.errors import ConfigError
    from grouprl.train.parallel.deepspeed import engine_config

    _launch_env(monkeypatch, 3)
    cfg = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_grad_norm=0.5)
    got = engine_config(cfg, 2)
    assert (got["train_micro_batch_size_per_gpu"], got["gradient_accumulation_steps"], got["train_batch_size"],
            got["gradient_clipping"]) == (4, 2, 16, 0.5)
    assert got["zero_optimization"]["stage"] == 3 and "auto" not in json.dumps(got) and "torch_autocast" not in got
    assert engine_config(cfg, 2, bf16_autocast=True)["torch_autocast"] == {  # bf16: true on a GPU
        "enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}  # no bf16 gradient reduction
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")  # what `accelerate config` writes
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=1, but grouprl's gradient_accumulation_steps "
                                          "gives 2.*leave gradient_accumulation_steps out"):
        engine_config(cfg, 2)
    monkeypatch.delenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    ds_json = tmp_path / "ds.json"  # a DeepSpeed config file (deepspeed_config_file in accelerate's config)
    ds_json.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(ds_json))
    for key in ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"):
        monkeypatch.delenv(key)
    got = engine_config(cfg, 2)  # a file without the batch fields (accelerate itself would write ga 1)
    assert (got["gradient_accumulation_steps"], got["zero_optimization"]["stage"]) == (2, 2)
    ds_json.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu=8, but grouprl's "
                                          "per_device_train_batch_size gives 4"):
        engine_config(cfg, 2)


def test_unsupported_deepspeed_settings_are_refused_before_the_process_group(monkeypatch):
    from grouprl.errors import ConfigError
    from grouprl.train.parallel import ranks as dist

    _launch_env(monkeypatch, 1)
    with pytest.raises(ConfigError, match="ZeRO stage 1.*zero_stage: 2 or 3"):
        dist._partial_state()
    _launch_env(monkeypatch, 3, ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE="cpu")
    with pytest.raises(ConfigError, match="offload_param on 'cpu'.*offload_param_device: none"):
        dist._partial_state()
    _launch_env(monkeypatch, 2, ACCELERATE_MIXED_PRECISION="bf16")
    with pytest.raises(ConfigError, match="mixed_precision: 'no'.*bf16: true"):
        dist._partial_state()


def test_deepspeed_refuses_what_it_does_not_run(monkeypatch):
    from grouprl.config import GRPOConfig
    from grouprl.errors import ConfigError
    from grouprl.train.parallel.ranks import check_config

    _launch_env(monkeypatch, 3)
    check_config(GRPOConfig(), 2)  # the default recipe runs
    for bad, match in [(dict(use_peft=True), "use_peft=true with DeepSpeed"),
                       (dict(dynamic_sampling="drop"), "dynamic_sampling='drop' with DeepSpeed"),
                       (dict(algorithm="ppo"), "algorithm='ppo' with 2 processes"),
                       (dict(algorithm="dpo"), "algorithm='dpo' with DeepSpeed")]:
        with pytest.raises(ConfigError, match=match):
            check_config(GRPOConfig(**bad), 2)


def test_a_checkpoint_of_another_stage_or_without_deepspeed_is_refused_with_the_fix(tmp_path):
    """Checked before DeepSpeed reads anything (its own error would be a bare AssertionError)."""
    from types import SimpleNamespace

    from grouprl.errors import ConfigError
    from grouprl.train.parallel.ranks import Ranks

    zero = tmp_path / "checkpoint-4" / "deepspeed" / "zero"  # what ZeRO-2 on 2 ranks writes
    zero.mkdir(parents=True)
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                 "zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        (zero / name).touch()
    d = Ranks()
    d.world, d.engine = 2, SimpleNamespace(zero_optimization_stage=lambda: 3)
    with pytest.raises(ConfigError, match="ZeRO-2 checkpoint written by 2 ranks; this run is configured for ZeRO-3"
                                          ".*zero_stage: 2.*--num_processes 2.*zero_to_fp32.py"):
        d.sharding.load_zero(zero.parent)
    (zero / "mp_rank_00_model_states.pt").unlink()  # what ZeRO-3 on 2 ranks writes: model states per rank
    for r in (0, 1):
        (zero / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt").touch()
    d.world = 3
    with pytest.raises(ConfigError, match="ZeRO-3 checkpoint resumes on as many ranks only, not 3"):
        d.sharding.load_zero(zero.parent)
    with pytest.raises(ConfigError, match="saved without DeepSpeed.*model_name_or_path="):
        d.sharding.load_zero(tmp_path / "plain" / "deepspeed")


# ---- a ZeRO-2 checkpoint of 2 ranks resumes on 3 (DeepSpeed's universal checkpoint) --------------------------
def adamw_engine(model_dir: str) -> tuple:
    """The tiny policy and grouprl's AdamW in a ZeRO-2 engine on this rank."""
    from transformers import AutoModelForCausalLM

    from grouprl.config import GRPOConfig
    from grouprl.train.parallel import ranks as dist
    from grouprl.train.engine.model import build_optimizer

    os.environ.update(run_env(2))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = GRPOConfig(learning_rate=1e-3, max_steps=4)
    optimizer, _ = build_optimizer(model, cfg, 4)
    assert dist.current().zero_init(model, optimizer, cfg)
    return dist.current(), model


def zero_state(model) -> dict:
    """Every parameter and its AdamW moments, whole (DeepSpeed's fragment gathering; every rank calls it)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    return {k: [safe_get_full_fp32_param(p).clone()] + [safe_get_full_optimizer_state(p, m).clone()
                                                        for m in ("exp_avg", "exp_avg_sq")]
            for k, p in model.named_parameters()}


def zero2_save(model_dir: str, out: str) -> dict:
    """Two ranks: one AdamW step on a random batch, then the DeepSpeed checkpoint (``Ranks.sharding.save_shards``)."""
    d, model = adamw_engine(model_dir)
    ids = torch.randint(5, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(d.rank))
    d.engine.backward(d.engine(input_ids=ids, labels=ids).loss)
    d.engine.step()
    assert d.sharding.save_shards(out, 1, model, None)
    return zero_state(model)


def zero2_load(model_dir: str, folder: str) -> dict:
    from pathlib import Path

    d, model = adamw_engine(model_dir)
    d.sharding.load_zero(Path(folder))
    return zero_state(model)


def test_zero2_checkpoint_resumes_on_another_rank_count_exactly(tiny_model_dir, tmp_path):
    """Saved on 2 ranks, loaded on 3: rank 0 converts it once (ds_to_universal) and every rank's fp32
    weights and AdamW moments are exactly the saved ones."""
    saved = values(run_ranks(zero2_save, 2, str(tiny_model_dir), str(tmp_path / "out"), workdir=tmp_path / "a",
                             timeout=200))[0]
    folder = tmp_path / "out" / ".tmp-checkpoint-1" / "deepspeed"
    loaded = values(run_ranks(zero2_load, 3, str(tiny_model_dir), str(folder), workdir=tmp_path / "b", timeout=200))
    assert (folder / "universal" / "zero").is_dir()
    for got in loaded:
        assert got.keys() == saved.keys()
        assert all(torch.equal(a, b) for k in saved for a, b in zip(got[k], saved[k]))
