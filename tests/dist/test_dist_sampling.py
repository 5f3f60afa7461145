"""Dynamic sampling on 2 gloo ranks (DAPO arXiv:2503.14476, Sec. 3.2): ``drop`` with ranks keeping different
numbers of groups (one rank none), and ``resample`` with ranks drawing extra prompts in lock-step.

Sampling is made deterministic by a plug-in backend (``FakeBackend``): completion j of prompt i depends on
(i, j) only, so the 2-rank run and a 1-process run with the same global batch see the very same
trajectories, and the 1-process run keeps the same groups. Both runs take SGD with momentum and no clipping (the update is
linear in the gradient: a gradient N times too large or too small shows), so their parameters must agree to
fp32 summation noise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_harness import run_ranks, values

ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(16)]
ZERO: set[int] = set()  # rows whose G completions are all the same (a zero-std group), set by the worker
GENERATED: list[list[int]] = []  # the rows of each generate call in this process


class FakeBackend:
    """``rollout_backend: "test_dist_sampling:FakeBackend"``: completion j of row i is 2 + j tokens drawn
    from a generator seeded by (i, j), ending with EOS; a row in ``ZERO`` gets the same 3 tokens for every j."""

    def __init__(self, model: Any, tokenizer: Any, **kwargs: Any) -> None:
        self.model, self.tokenizer = model, tokenizer

    def sync_weights(self, model: Any) -> None:
        self.model = model

    def generate(self, prompts: list[str], n: int, params: Any) -> Any:
        from grouprl.rollout.base import Rollout
        from grouprl.rollout.hf import tokenize_left

        rows = [int(re.search(r"What is (\d+) \+", p).group(1)) for p in prompts]
        GENERATED.append(rows)
        ids, mask = tokenize_left(self.tokenizer, prompts, params.max_prompt_length)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        T = 2 + n
        completion_ids = torch.full((len(rows) * n, T), pad, dtype=torch.long)
        completion_mask = torch.zeros((len(rows) * n, T), dtype=torch.long)
        for a, i in enumerate(rows):
            for j in range(n):
                k = 3 if i in ZERO else 2 + j
                g = torch.Generator().manual_seed(1000 * i + (0 if i in ZERO else j))
                tokens = torch.randint(5, 300, (k - 1,), generator=g).tolist() + [eos]
                completion_ids[a * n + j, :k] = torch.tensor(tokens)
                completion_mask[a * n + j, :k] = 1
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        return Rollout(ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0), completion_ids,
                       completion_mask, torch.zeros(len(texts), dtype=torch.bool), texts,
                       [p for p in prompts for _ in range(n)])


class SharedFakeBackend(FakeBackend):
    """``FakeBackend`` as one engine for every rank (a vLLM server): rank 0 generates every rank's prompts."""

    shared_engine = True


def num_tokens(completions, completion_ids, **kwargs):
    """The reward: the completion's length in tokens (2 + j, or 3 for every j of a zero row)."""
    return [float(len(ids)) for ids in completion_ids]


def sgd(model, cfg, total_steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def train(model_dir: str, output_dir: str, zero: list[int], mode: str, steps: int,
          backend: str = "FakeBackend") -> dict[str, Any]:
    """One GRPOTrainer run of ``steps`` steps (2 prompts x 2 completions per rank per step) on this process
    (with SGD: ``grouprl.train.algorithms.grpo.build_optimizer`` is patched by the caller)."""
    from grouprl import GRPOConfig, GRPOTrainer
    from grouprl.train.parallel import ranks as dist

    ZERO.clear()
    ZERO.update(zero)
    GENERATED.clear()
    world = dist.current().world
    cfg = GRPOConfig(model=model_dir, output_dir=output_dir, num_generations=2,
                     per_device_train_batch_size=4 * 2 // world, gradient_accumulation_steps=1, max_new_tokens=4,
                     max_prompt_length=64, max_steps=steps, progress_bar=False, save_strategy="steps",
                     save_steps=100, seed=0, eval_split=None, dynamic_sampling=mode, max_resample_rounds=3,
                     rollout_backend=f"test_dist_sampling:{backend}", kl_coef=0.0,
                     max_grad_norm=0.0)
    trainer = GRPOTrainer(config=cfg, train_dataset=[dict(r) for r in ROWS], reward_funcs=[num_tokens])
    trainer.train()
    return {"params": {k: v.detach().clone() for k, v in trainer.model.named_parameters()},
            "generated": [list(g) for g in GENERATED]}


def both_modes(model_dir: str, out: str, drop_zero: list[int], resample_zero: list[int]) -> dict[str, Any]:
    """The drop run (3 steps) and the resample runs (2 steps; one with an engine shared by the ranks) in one
    launch (starting processes is the slow part)."""
    import grouprl.train.algorithms.grpo as loop

    loop.build_optimizer = sgd  # a spawned rank: nothing to undo
    return {"drop": train(model_dir, f"{out}/drop", drop_zero, "drop", 3),
            "resample": train(model_dir, f"{out}/resample", resample_zero, "resample", 2),
            "shared": train(model_dir, f"{out}/shared", resample_zero, "resample", 2, "SharedFakeBackend")}


def _order() -> list[int]:
    """The global prompt order: rows of the first epoch (4 prompts per round, 2 per rank)."""
    from grouprl.data.stream import PromptStream

    s = PromptStream(len(ROWS), 4, 0)
    return [i for _ in range(4) for i in s.next()]


def _metrics(path: Path) -> list[dict]:
    return [r for r in map(json.loads, (path / "metrics.jsonl").read_text().splitlines()) if "reward" in r]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    import grouprl.train.algorithms.grpo as loop

    o = _order()
    # drop: round 1 rank 1 keeps nothing (rank 0: 2); round 2 rank 0 keeps 1 (rank 1: 2); round 3 nobody keeps any
    drop_zero = [o[2], o[3], o[4], *o[8:12]]
    # resample: rank 1 is one group short -> both ranks draw the next global batch; rank 0 (full) does not
    # generate, rank 1 keeps o[6]; one process on the global batch keeps the same 4 groups
    resample_zero = [o[2], o[4], o[5]]
    tmp = tmp_path_factory.mktemp("sampling")
    two = values(run_ranks(both_modes, 2, str(tiny_model_dir), str(tmp / "two"), drop_zero, resample_zero,
                           workdir=tmp / "w2", timeout=240))
    with pytest.MonkeyPatch.context() as mp:  # the 1-process reference runs here (one process start less)
        mp.setattr(loop, "build_optimizer", sgd)
        one = {"drop": train(str(tiny_model_dir), str(tmp / "one" / "drop"), drop_zero, "drop", 3),
               "resample": train(str(tiny_model_dir), str(tmp / "one" / "resample"), resample_zero, "resample", 2)}
    return o, tmp, two, one


def _assert_same_params(two: list[dict], one: dict, start: dict) -> None:
    ref = one["params"]
    assert max(float((ref[k] - start[k]).abs().max()) for k in ref) > 1e-4, "the reference did not train"
    for r, got in enumerate(two):
        worst = max(float((got["params"][k] - ref[k]).abs().max()) for k in ref)
        assert worst <= 1e-6, f"rank {r} differs from one process by {worst:.3g}"


@pytest.fixture(scope="module")
def start(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}


def test_drop_with_uneven_and_empty_ranks_equals_one_process(runs, start):
    o, tmp, two, one = runs
    _assert_same_params([r["drop"] for r in two], one["drop"], start)  # weights identical, gradient = 1 process
    two_m, one_m = _metrics(tmp / "two" / "drop"), _metrics(tmp / "one" / "drop")
    assert [m["step"] for m in two_m] == [1, 2, 3]  # each step logged once (rank 0)
    # the global count of kept groups: 2 (rank 1 none), 3, then 4 (no rank kept any: every rank trains its batch)
    assert [m["dynamic/kept_groups"] for m in two_m] == [m["dynamic/kept_groups"] for m in one_m] == [2.0, 3.0, 4.0]
    for a, b in zip(two_m, one_m):  # step metrics are exact global values
        assert a["num_tokens"] == b["num_tokens"] and a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert two_m[0]["advantage/mean"] == pytest.approx(0.0, abs=1e-6)  # rank 1's NaN (no groups) is left out
    assert two_m[2]["grad_norm"] == 0.0 and two_m[2]["advantage/frac_zero"] == 1.0


def test_resample_draws_in_lock_step_and_equals_one_process(runs, start):
    o, tmp, two, one = runs
    _assert_same_params([r["resample"] for r in two], one["resample"], start)
    assert two[0]["resample"]["generated"] == [o[0:2], o[8:10]]  # rank 0 was full: it skipped the extra batch
    assert two[1]["resample"]["generated"] == [o[2:4], o[6:8], o[10:12]]
    assert one["resample"]["generated"] == [o[0:4], o[4:8], o[8:12]]
    # one engine for both ranks: rank 0 generates every request, also the extra batch for which it is full
    _assert_same_params([r["shared"] for r in two], one["resample"], start)
    assert two[0]["shared"]["generated"] == [o[0:4], o[4:8], o[8:12]] and two[1]["shared"]["generated"] == []
    two_m = _metrics(tmp / "two" / "resample")
    assert [m["dynamic/extra_rounds"] for m in two_m] == [1.0, 0.0]
    assert [m["dynamic/kept_groups"] for m in two_m] == [4.0, 4.0]
    for run in ("two", "one"):  # the data position is global: 3 global batches of 4 prompts were drawn
        state = torch.load(tmp / run / "resample" / "checkpoint-2" / "trainer_state.pt", weights_only=False)
        assert state["data"] == {"epoch": 0, "pos": 12}
