"""The PPO critic: the policy's architecture with a scalar head, one value per completion token.

The critic is a plain ``AutoModelForTokenClassification`` with ``num_labels = 1`` (the backbone of the
causal LM plus a ``hidden -> 1`` linear head, no dropout), so it saves and loads like any transformers
model. ``critic_model: None`` copies the policy's backbone weights and zero-initialises the head (every
value starts at 0: no arbitrary baseline before the critic has seen a return); a path loads a causal LM's
backbone (a new head, zero-initialised) or a critic saved by an earlier run (its head kept).

Alignment: V_t, the value of the state before completion token t is sampled, is read at the hidden state
of position t - 1 -- the same position whose logits give log pi(y_t) (``train.engine.logp.completion_logps``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from grouprl.errors import ConfigError


def value_head(critic: Any) -> torch.nn.Linear:
    """The ``hidden -> 1`` linear head of a token-classification critic (``score`` or ``classifier``)."""
    for name in ("score", "classifier"):
        head = getattr(critic, name, None)
        if isinstance(head, torch.nn.Linear) and head.out_features == 1:
            return head
    raise ConfigError(f"critic {type(critic).__name__} has no scalar head (score / classifier with one output). "
                      f"Fix: use a causal LM or a critic saved by grouprl as critic_model.")


def build_critic(policy: Any, critic_model: str | None, device: torch.device) -> Any:
    """A value model for ``policy``: a copy of its backbone (``critic_model=None``) or loaded from a path."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    from grouprl.models import resolve_model_path

    if critic_model is not None:
        path = resolve_model_path(critic_model)
        try:
            config = AutoConfig.from_pretrained(path, num_labels=1)
            config.classifier_dropout = 0.0
            critic = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise ConfigError(f"critic_model={critic_model!r} could not be loaded as a token-classification model "
                              f"({e}). Fix: give a causal LM of a supported architecture, a critic saved by "
                              f"grouprl (<output_dir>/critic), or null to copy the policy.") from e
        fresh = not getattr(critic.config, "grouprl_critic", False)
    else:
        config = copy.deepcopy(policy.config)
        config.num_labels, config.classifier_dropout = 1, 0.0
        critic = AutoModelForTokenClassification.from_config(config, dtype=torch.float32)
        backbone = getattr(policy, policy.base_model_prefix)
        getattr(critic, critic.base_model_prefix).load_state_dict(backbone.state_dict())
        fresh = True
    if fresh:
        head = value_head(critic)
        with torch.no_grad():
            head.weight.zero_()
            if head.bias is not None:
                head.bias.zero_()
    critic.config.grouprl_critic = True  # saved with it: a reload keeps the trained head
    critic.config.use_cache = False
    critic.train()
    return critic.to(device)


def critic_values(critic: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                  completion_mask: torch.Tensor) -> torch.Tensor:
    """V(x, y_<t) for every completion token t: ``[N, T]`` in fp32 (positions as in ``completion_logps``)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    T = completion_ids.shape[1]
    out = critic(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False)
    return out.logits[:, -T - 1:-1, 0].float()
