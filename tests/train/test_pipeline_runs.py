"""Whole runs through the asynchronous pipeline (grouprl.train.pipeline) on the tiny model: max_staleness 0
is the synchronous loop to the bit, the bound holds step by step (read from samples.jsonl and the metrics),
a slowed trainer makes the worker wait, agent rounds go through the worker, and a worker that crashes or
hangs ends the run within seconds with an error naming the worker, the step and the fix."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import pytest
import torch
import transformers
from pipeline_helpers import crash_in_worker, hang_in_worker, raise_in_worker, reward, syncs_so_far
from train_helpers import train_records

import grouprl.train.algorithms.grpo as grpo_mod
from grouprl import GRPOTrainer
from grouprl.errors import ConfigError
from grouprl.train.pipeline import RolloutWorkerError

GOLDEN = Path(__file__).parent.parent / "fixtures" / "sync_metrics_before_async.json"


def _samples(cfg):
    return [json.loads(x) for x in Path(cfg.output_dir, "samples.jsonl").read_text().splitlines()]


ADDED = ("data/ordinal_min", "data/ordinal_max")  # logged since the golden record (tests/train/test_ordinals.py)


def _no_time(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k not in ("tokens_per_s", "time", *ADDED)}
            for r in records]


def test_max_staleness_0_is_the_synchronous_loop_bit_for_bit(tiny_model_dir, train_rows, fast_config, monkeypatch):
    """The metrics of a 3-step run equal those the loop wrote before the pipeline existed (recorded on
    this platform), and the synchronous path never touches the pipeline."""
    golden = json.loads(GOLDEN.read_text())
    if (golden["torch"], golden["transformers"], golden["machine"]) != (
            torch.__version__, transformers.__version__, platform.machine()):
        pytest.skip("the recorded metrics come from another torch / transformers / CPU")

    def no_pipeline(*args, **kwargs):
        raise AssertionError("max_staleness=0 must not start a rollout worker")

    monkeypatch.setattr(grpo_mod, "open_pipeline", no_pipeline)
    cfg = fast_config(max_steps=3)
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=reward).train()
    got = json.loads(json.dumps(_no_time([json.loads(x) for x in open(f"{cfg.output_dir}/metrics.jsonl")]),
                                sort_keys=True))
    assert got == golden["records"]
    assert [(s["step"], s["ordinal"], s["policy_version"]) for s in _samples(cfg)][::4] == [
        (1, 0, 0), (1, 1, 0), (2, 2, 1), (2, 3, 1), (3, 4, 2), (3, 5, 2)]


def test_k2_with_a_slowed_trainer_holds_the_bound_and_the_worker_waits(tiny_model_dir, train_rows, fast_config,
                                                                        monkeypatch):
    real = grpo_mod.take_step

    def slow_step(*args, **kwargs):
        time.sleep(0.4)  # the trainer is the slow side: the worker, 2 rounds ahead, must wait for weights
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo_mod, "take_step", slow_step)
    cfg = fast_config(max_steps=6, max_staleness=2, async_timeout_s=60)
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=reward).train()
    recs = train_records(cfg.output_dir)
    # one step per round, a push after every step: round j is sampled by version max(0, j - 2)
    assert [r["async/policy_version"] for r in recs] == [0, 0, 0, 1, 2, 3]
    assert [r["async/staleness_max"] for r in recs] == [0, 1, 2, 2, 2, 2]
    assert all(r["async/dropped"] == 0 for r in recs)
    assert sum(r["async/rollout_wait_s"] for r in recs[3:]) > 0.2  # it waited for the weights of its rounds
    assert recs[0]["mismatch/logp_abs_diff"] == 0.0  # same weights: behaviour log-probs == the trainer's
    assert all(r["mismatch/logp_abs_diff"] > 0 for r in recs[1:])  # older weights: a gap, corrected by TIS
    samples = _samples(cfg)
    for s in samples:  # the bound, sample by sample: trained at version step - 1
        assert 0 <= (s["step"] - 1) - s["policy_version"] <= 2
    # every prompt of the stream trained once, in order (2 prompts x 4 completions per step, all logged)
    assert [s["ordinal"] for s in samples][::4] == [o for o in range(12)]
    assert all(r["epoch"] == (0 if r["step"] <= 4 else 1) for r in recs)  # the trainer's stream moved with the rounds


def test_rounds_do_not_depend_on_timing(tiny_model_dir, train_rows, fast_config, monkeypatch, tmp_path):
    """Which weights and which seed sample round j is fixed by (j, k, weight_sync_steps, seed): a run whose
    trainer is slowed (the worker then runs ahead and waits) trains exactly what an unslowed run trains."""
    def run(out, delay):
        real = grpo_mod.take_step

        def step(*args, **kwargs):
            time.sleep(delay)
            return real(*args, **kwargs)

        monkeypatch.setattr(grpo_mod, "take_step", step)
        cfg = fast_config(output_dir=str(out), max_steps=4, max_staleness=2, async_timeout_s=60)
        trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=reward)
        trainer.train()
        monkeypatch.setattr(grpo_mod, "take_step", real)
        drop = ("async/trainer_wait_s", "async/rollout_wait_s", "async/worker_generate_s", "async/worker_reward_s",
                "async/worker_logp_s")
        recs = [{k: v for k, v in r.items() if k not in drop} for r in _no_time(train_records(cfg.output_dir))]
        return recs, [(s["completion"], s["ordinal"], s["policy_version"]) for s in _samples(cfg)], \
            {k: v.detach().clone() for k, v in trainer.model.named_parameters()}

    a, b = run(tmp_path / "fast", 0.0), run(tmp_path / "slow", 0.5)
    assert a[0] == b[0] and a[1] == b[1]
    assert all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def test_the_workers_backend_gets_each_new_version_before_it_samples(tiny_model_dir, train_rows, fast_config):
    """Through the engine interface: the worker's backend (its own copy -- a bf16 sampler copy, an Engine
    plug-in) is given the weights each time the version changes, before the round. The reward is the count
    of versions it was given when it scored: versions [0, 0, 1, 2] -> [1, 1, 2, 3]."""
    cfg = fast_config(max_steps=4, max_staleness=1, async_timeout_s=60,
                      rollout_backend="pipeline_helpers:SyncCountingBackend")
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=syncs_so_far).train()
    recs = train_records(cfg.output_dir)
    assert [r["async/policy_version"] for r in recs] == [0, 0, 1, 2]
    assert [r["reward"] for r in recs] == [1.0, 1.0, 2.0, 3.0]


def test_agent_rounds_go_through_the_worker(tiny_model_dir, train_rows, fast_config):
    cfg = fast_config(max_steps=3, max_staleness=1, environment="calculator", reward_funcs=["accuracy"],
                      max_new_tokens=8, async_timeout_s=60)
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows).train()
    recs = train_records(cfg.output_dir)
    assert [r["async/staleness_max"] for r in recs] == [0, 1, 1]
    assert all("turns/mean" in r and "mismatch/logp_abs_diff" in r for r in recs)
    samples = _samples(cfg)
    assert all("num_turns" in s and "loss_mask" in s for s in samples)
    assert [s["ordinal"] for s in samples][::4] == list(range(6))


@pytest.mark.parametrize("fn,detail", [(crash_in_worker, "died with exit code 3"),
                                       (raise_in_worker, "reward exploded on purpose in the rollout worker")])
def test_a_crashing_worker_ends_the_run_in_seconds(fn, detail, tiny_model_dir, train_rows, fast_config):
    cfg = fast_config(max_staleness=1, async_timeout_s=60)
    t0 = time.monotonic()
    with pytest.raises(RolloutWorkerError) as err:
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=fn).train()
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "rollout worker 0 (process" in msg and "at optimizer step 0 waiting for round 0" in msg
    assert detail in msg and "Fix:" in msg


def test_a_hanging_worker_ends_the_run_at_the_timeout(tiny_model_dir, train_rows, fast_config):
    cfg = fast_config(max_staleness=1, async_timeout_s=6)
    t0 = time.monotonic()
    with pytest.raises(RolloutWorkerError, match=r"(?s)delivered no round within async_timeout_s=6 s.*raise async_timeout_s"):
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows,
                    reward_funcs=hang_in_worker).train()
    assert time.monotonic() - t0 < 60


def test_a_reward_the_worker_cannot_import_is_refused_before_it_starts(tiny_model_dir, train_rows, fast_config):
    cfg = fast_config(max_staleness=1)
    with pytest.raises(ConfigError, match=r"a reward function cannot be sent to the rollout worker.*module level"):
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows,
                    reward_funcs=lambda completions, **kw: [0.0] * len(completions)).train()


def test_ctrl_c_to_the_process_group_saves_and_stops_the_worker(tiny_model_dir, tmp_path):
    """Ctrl-C reaches the trainer AND its worker (one process group): the worker ignores it, the trainer
    finishes its step, saves, stops the worker and exits 130 -- a graceful stop, not a worker error."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    recipe = Path(__file__).parent / "recipes" / "tiny_grpo.yaml"
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) for i in range(8)))
    out = tmp_path / "out"
    code = "import sys; from grouprl.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "train", "-c", str(recipe), f"model={tiny_model_dir}", f"dataset={data}",
           f"output_dir={out}", "eval_split=null", "max_steps=40", "save_steps=100", "max_staleness=1",
           "reward_funcs=[train_helpers:alpha_fraction]"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:  # interrupt once step 2 is logged
            if (out / "metrics.jsonl").is_file() and '"step": 2' in (out / "metrics.jsonl").read_text():
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 130, err
    step = max(r["step"] for r in train_records(out))
    assert (out / f"checkpoint-{step}").is_dir() and "RolloutWorkerError" not in err
    time.sleep(1)
    assert workers and not [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
