"""The critic: the policy's backbone plus a scalar head; shapes, initialisation, loading and saving."""

from __future__ import annotations

import pytest
import torch

from grouprl.train.algorithms.critic import build_critic, critic_values, value_head


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _batch(n=3, p=4, t=5):
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, 50, (n, p), generator=g)
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding
    completion_ids = torch.randint(3, 50, (n, t), generator=g)
    completion_mask = (torch.arange(t) < torch.tensor([5, 3, 1]).unsqueeze(-1)).long()
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def test_critic_from_the_policy_copies_the_backbone_and_starts_at_zero(policy):
    critic = build_critic(policy, None, torch.device("cpu"))
    head = value_head(critic)
    hidden = policy.config.hidden_size
    assert head.weight.shape == (1, hidden) and head.out_features == 1
    assert head.weight.abs().sum() == 0 and (head.bias is None or head.bias.abs().sum() == 0)
    for name, w in policy.model.state_dict().items():  # the same backbone weights, a separate copy
        assert torch.equal(critic.model.state_dict()[name], w), name
    assert critic.model.embed_tokens.weight.data_ptr() != policy.model.embed_tokens.weight.data_ptr()
    values = critic_values(critic, *_batch())
    assert values.shape == (3, 5) and values.dtype == torch.float32
    assert (values == 0).all()  # zero head: every value starts at 0
    assert critic.dropout.p == 0.0  # no dropout on the value


def test_values_are_read_one_position_before_the_token(policy):
    # V_t is the head applied to the hidden state at position t - 1 (as logits for log pi(y_t) are)
    critic = build_critic(policy, None, torch.device("cpu"))
    torch.manual_seed(1)
    torch.nn.init.normal_(value_head(critic).weight)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    values = critic_values(critic, prompt_ids, prompt_mask, completion_ids, completion_mask)
    ids = torch.cat([prompt_ids, completion_ids], 1)
    att = torch.cat([prompt_mask, completion_mask], 1)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    hidden = critic.model(input_ids=ids, attention_mask=att, position_ids=pos).last_hidden_state
    expected = value_head(critic)(hidden)[:, 3:8, 0]  # P = 4: token t at 4 + t, its state at 3 + t
    torch.testing.assert_close(values, expected)
    assert values.requires_grad  # trained through this function


def test_critic_from_a_path_and_a_saved_critic_keeps_its_head(tiny_model_dir, policy, tmp_path):
    from_path = build_critic(policy, str(tiny_model_dir), torch.device("cpu"))
    assert value_head(from_path).weight.abs().sum() == 0  # a causal LM's backbone: new, zero head
    torch.testing.assert_close(from_path.model.embed_tokens.weight, policy.model.embed_tokens.weight)
    with torch.no_grad():
        value_head(from_path).weight.fill_(0.5)
    from_path.save_pretrained(tmp_path / "critic")
    again = build_critic(policy, str(tmp_path / "critic"), torch.device("cpu"))
    assert (value_head(again).weight == 0.5).all()  # a grouprl critic keeps its trained head


def test_a_missing_critic_path_is_a_clear_error(policy, tmp_path):
    from grouprl.errors import ConfigError

    with pytest.raises(ConfigError, match="critic_model="):
        build_critic(policy, str(tmp_path / "nowhere"), torch.device("cpu"))
