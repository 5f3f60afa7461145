"""One PPO update by hand: token rewards, GAE, whitening, the policy step on token advantages and the
critic's clipped value loss, with every number derived in the comments."""

from __future__ import annotations

import math
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

from grouprl.algo.advantages import compute_gae
from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.train.algorithms.ppo import Critic, ValueTargets, critic_step, token_rewards, whiten_round
from grouprl.train.engine.step import LossSpec, MicroBatch, completion_logps, optimizer_step
from grouprl.train.metrics import Timers


def test_token_rewards_kl_on_every_token_and_the_reward_on_the_last():
    # kl_coef 0.5. row 0: 3 real tokens, KL [0.1, 0.2, 0.3] -> [-0.05, -0.1, -0.15 + 1] = [-0.05, -0.1, 0.85]
    # row 1: a tool token in the middle (mask [1, 0, 1]): KL on it is ignored, reward 2 on position 2:
    #        [-0.5*0.4, 0, -0.5*(-0.2) + 2] = [-0.2, 0, 2.1]
    # row 2: NaN reward (no opinion) -> 0; 2 real tokens, KL 0 -> [0, 0, 0]
    # row 3: no real token: its reward 0.5 has nowhere to go -> [0, 0, 0]
    rewards = torch.tensor([1.0, 2.0, float("nan"), 0.5])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 0], [0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 9.0, -0.2], [0.0, 0.0, 7.0], [5.0, 5.0, 5.0]])
    r = token_rewards(rewards, mask, kl, kl_coef=0.5)
    assert r.tolist() == [pytest.approx(x) for x in ([-0.05, -0.1, 0.85], [-0.2, 0.0, 2.1], [0, 0, 0], [0, 0, 0])]
    assert token_rewards(rewards, mask).tolist()[0] == [0.0, 0.0, 1.0]  # no KL: the reward alone


def test_whiten_round_over_micro_batches_of_different_lengths():
    # real tokens 1, 2, 3 (first micro-batch, T = 2) and 5 (second, T = 3); 9s are masked.
    # mean 2.75; unbiased var = (1.75^2 + 0.75^2 + 0.25^2 + 2.25^2) / 3 = 8.75 / 3 = 2.916667, std 1.707825
    # -> (1 - 2.75) / 1.707825 = -1.024695, -0.439155, 0.146385, 1.317465; masked -> 0
    a = [torch.tensor([[1.0, 2.0], [3.0, 9.0]]), torch.tensor([[5.0, 9.0, 9.0]])]
    m = [torch.tensor([[1, 1], [1, 0]]), torch.tensor([[1, 0, 0]])]
    w = whiten_round(a, m)
    assert w[0].tolist()[0] == pytest.approx([-1.024695, -0.439155], abs=1e-6)
    assert w[0].tolist()[1] == pytest.approx([0.146385, 0.0], abs=1e-6)
    assert w[1].tolist()[0] == pytest.approx([1.317465, 0.0, 0.0], abs=1e-6)


class TablePolicy(torch.nn.Module):
    """Logits [L, V] per position, the same for every row: a 'model' whose log-probs we choose."""

    def __init__(self, logits):
        super().__init__()
        self.table = torch.nn.Parameter(logits.clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, use_cache=False):
        out = self.table[: input_ids.shape[1]].unsqueeze(0).expand(input_ids.shape[0], -1, -1)
        return SimpleNamespace(logits=out[:, -logits_to_keep:] if logits_to_keep else out)


class TableCritic(torch.nn.Module):
    """A value per position, the same for every row (``logits [N, L, 1]`` like a token-classification head)."""

    def __init__(self, values):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(values))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return SimpleNamespace(logits=self.table[: input_ids.shape[1]].view(1, -1, 1).expand(input_ids.shape[0], -1, -1))


def _mb():
    # one prompt token, two completion tokens (ids 0 and 1)
    return MicroBatch(torch.tensor([[2]]), torch.tensor([[1]]), torch.tensor([[0, 1]]), torch.tensor([[1, 1]]),
                      torch.tensor([[1, 1]]), torch.zeros(1))


def test_one_ppo_update_policy_and_value_losses_by_hand():
    # Rollout: sequence reward 1 at the last of T = 2 tokens, no KL, V_old = [0.5, 0.8], gamma = lam = 1:
    #   t1: A1 = 1 - 0.8 = 0.2;  t0: A0 = 0 + 0.8 - 0.5 + 0.2 = 0.5;  R = A + V = [1.0, 1.0]
    mb = _mb()
    old_values = torch.tensor([[0.5, 0.8]])
    r = token_rewards(torch.tensor([1.0]), mb.loss_mask)
    adv, ret = compute_gae(r, old_values, mb.loss_mask, gamma=1.0, lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.5, 0.2]) and ret.tolist()[0] == pytest.approx([1.0, 1.0])
    mb.adv = adv  # token-level [1, 2], no whitening here

    # Policy: the policy has moved so that ratios are [1.5, 0.9] (old_logp = logp - log ratio).
    #   t0: A = 0.5 > 0, ratio 1.5 > 1.2 -> objective min(0.75, 0.6) = 0.6 (clipped, no gradient)
    #   t1: A = 0.2, ratio 0.9 inside [0.8, 1.2] -> 0.18; loss = -(0.6 + 0.18) / 2 tokens = -0.39
    #   clip_frac = 1/2 (t0, clipped from above with A > 0)
    policy = TablePolicy(torch.tensor([[0.0, 0.0, 0.0], [0.3, -0.2, 0.1], [1.0, 0.5, -1.0], [0.2, 0.2, 0.2]]))
    logp, _ = completion_logps(policy, mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask)
    mb.old_logp = (logp - torch.log(torch.tensor([[1.5, 0.9]]))).detach()
    spec = LossSpec(POLICY_LOSSES.get("grpo"), {"eps_low": 0.2, "eps_high": 0.2}, AGGREGATIONS.get("token_mean"),
                    KL_ESTIMATORS.get("k3"), 0.0, 1.0)
    cfg = SimpleNamespace(max_new_tokens=2, max_grad_norm=0.0, vf_coef=0.5, cliprange_value=0.2)
    ctx = SimpleNamespace(cfg=cfg, model=policy, autocast=nullcontext)
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    out = optimizer_step(ctx, [mb], spec, opt, sched, Timers())
    assert out["loss/policy"] == pytest.approx(-0.39, abs=1e-6)
    assert out["policy/clip_frac"] == pytest.approx(0.5) and out["policy/clip_frac_high"] == pytest.approx(0.5)
    assert out["policy/ratio_max"] == pytest.approx(1.5, abs=1e-6)

    # Critic: new values [0.9, 0.7] (table positions 0 and 1: V_t sits one position before token t),
    # V_old = [0.5, 0.8], R = [1, 1], cliprange_value 0.2:
    #   t0: (0.9 - 1)^2 = 0.01; clipped V = 0.5 + clamp(0.4, +-0.2) = 0.7 -> (0.7 - 1)^2 = 0.09; max -> 0.045
    #   t1: (0.7 - 1)^2 = 0.09; |0.7 - 0.8| < 0.2: clipped V = 0.7, the same 0.09 -> 0.045
    #   value loss = (0.045 + 0.045) / 2 tokens = 0.045; vf_clip_frac = 1/2 (t0: the clipped error is larger)
    # Gradient: t0 is on the clipped branch (none); t1: (0.7 - 1) / 2 tokens = -0.15, x vf_coef 0.5 = -0.075
    # -> grad norm 0.075. AdamW's first step moves a parameter by lr * g / (|g| + eps) = lr * sign(g):
    # table[1] 0.7 -> 0.71 with lr 0.01, table[0] unchanged (zero gradient).
    critic_model = TableCritic([0.9, 0.7, 123.0])
    copt = torch.optim.AdamW(critic_model.parameters(), lr=0.01, weight_decay=0.0)
    critic = Critic(critic_model, copt, torch.optim.lr_scheduler.LambdaLR(copt, lambda _: 1.0))
    vout = critic_step(cfg, critic, [mb], [ValueTargets(old_values, ret)], nullcontext, Timers())
    assert vout["loss/value"] == pytest.approx(0.045, abs=1e-6)
    assert vout["value/clip_frac"] == pytest.approx(0.5)
    assert vout["value/grad_norm"] == pytest.approx(0.075, abs=1e-6)
    assert vout["value/skipped"] == 0.0
    assert critic_model.table.tolist() == pytest.approx([0.9, 0.71, 123.0], abs=1e-6)


def test_critic_step_skips_a_non_finite_value_loss():
    mb = _mb()
    critic_model = TableCritic([0.9, 0.7, 0.0])
    copt = torch.optim.AdamW(critic_model.parameters(), lr=0.01)
    critic = Critic(critic_model, copt, torch.optim.lr_scheduler.LambdaLR(copt, lambda _: 1.0))
    cfg = SimpleNamespace(vf_coef=1.0, cliprange_value=None, max_grad_norm=1.0)
    bad = ValueTargets(torch.zeros(1, 2), torch.tensor([[math.inf, 1.0]]))
    out = critic_step(cfg, critic, [mb], [bad], nullcontext, Timers())
    assert out["value/skipped"] == 1.0
    assert critic_model.table.tolist() == pytest.approx([0.9, 0.7, 0.0])  # no update
