"""The loss never trains on tool output: zero gradient on mask-0 tokens, and a loss that does not depend
on what the tool returned (only on the tokens the model sampled)."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import FakeEnv, chatml_tokenizer, scripted_generate

import grouprl.algo  # noqa: F401 -- fills the registries
from grouprl.registry import AGGREGATIONS, POLICY_LOSSES
from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout
from grouprl.rollout.trajectory import stack_trajectories

E = "<|im_end|>"
SCRIPTS = [[f"<tool_call>f()</tool_call>{E}", f"<tool_call>add(a=1, b=2)</tool_call>{E}", f"it is 7{E}"],
           [f"<tool_call>f()</tool_call>{E}", f"seven{E}"]]


class VerboseEnv(FakeEnv):
    """Same tools, much longer results: the tool turns change, the sampled tokens do not."""

    def call(self, name, arguments):
        return f"the result of {name} is {super().call(name, arguments)} (computed exactly, 100% sure)"


def batch(env):
    tok = chatml_tokenizer()
    rollout = MultiTurnRollout(tok, scripted_generate(tok, SCRIPTS), MultiTurnParams(max_new_tokens=300),
                               env_factory=env)
    trajs = rollout.run([{"prompt": "a"}, {"prompt": "b"}])
    assert [t.end_reason for t in trajs] == ["answered", "answered"]
    return stack_trajectories(trajs, pad_id=tok.pad_token_id)


def loss_of(logp, old_logp, mask, agg):
    adv = torch.tensor([1.0, -0.5])
    per_token, _ = POLICY_LOSSES.get("grpo")(logp, old_logp, adv, mask)
    return AGGREGATIONS.get(agg)(per_token, mask, max_len=300)


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
def test_gradient_on_tool_tokens_is_exactly_zero(agg):
    b = batch(FakeEnv)
    assert (b.loss_mask == 0).logical_and(b.completion_mask == 1).sum() > 40  # there are tool tokens
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(b.loss_mask.shape, generator=gen)).requires_grad_()
    old_logp = logp.detach() + 0.05 * torch.randn(b.loss_mask.shape, generator=gen)
    loss_of(logp, old_logp, b.loss_mask, agg).backward()
    assert torch.all(logp.grad[b.loss_mask == 0] == 0)
    assert torch.all(logp.grad[b.loss_mask == 1] != 0)


def sampled_logp(b, values):
    """logp [N,T]: the k-th sampled token of row i gets values[i][k]; tool tokens get arbitrary values."""
    logp = -5 * torch.rand(b.loss_mask.shape, generator=torch.Generator().manual_seed(len(b.loss_mask[0])))
    for i in range(len(b)):
        where = b.loss_mask[i].nonzero().flatten()
        logp[i, where] = values[i][: len(where)]
    return logp


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
def test_loss_ignores_the_tool_output_text(agg):
    short, long = batch(FakeEnv), batch(VerboseEnv)
    assert long.completion_ids.shape[1] > short.completion_ids.shape[1]
    for i in range(2):  # the same sampled tokens, in the same order
        assert short.completion_ids[i][short.loss_mask[i] == 1].tolist() == \
            long.completion_ids[i][long.loss_mask[i] == 1].tolist()
    gen = torch.Generator().manual_seed(1)
    values = -torch.rand(2, 64, generator=gen)
    old_values = values + 0.1 * torch.randn(2, 64, generator=gen)
    losses = [loss_of(sampled_logp(b, values), sampled_logp(b, old_values), b.loss_mask, agg) for b in (short, long)]
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=1e-7)
    assert losses[0] != 0
