"""DPO's preference losses are a registry (PREFERENCE_LOSSES) like every other extension point: the loop
looks the configured name up, passes only the hyper-parameters the function declares, and reads from the
function whether it wants token-averaged log-probs (IPO) or sums (DPO)."""

from __future__ import annotations

import torch

from grouprl import GRPOConfig
from grouprl.algo.losses import dpo_ipo_loss, dpo_sigmoid_loss
from grouprl.registry import PREFERENCE_LOSSES
from grouprl.train.algorithms.dpo import preference_loss


def test_the_registry_holds_the_two_losses():
    assert PREFERENCE_LOSSES.names() == ["ipo", "sigmoid"]
    assert PREFERENCE_LOSSES.get("sigmoid") is dpo_sigmoid_loss and PREFERENCE_LOSSES.get("ipo") is dpo_ipo_loss


def test_each_loss_gets_only_what_it_declares():
    fn, hp, averaged = preference_loss(GRPOConfig(algorithm="dpo", dpo_beta=0.25, dpo_label_smoothing=0.1))
    assert (fn, hp, averaged) == (dpo_sigmoid_loss, {"beta": 0.25, "label_smoothing": 0.1}, False)
    fn, hp, averaged = preference_loss(GRPOConfig(algorithm="dpo", dpo_loss="ipo", dpo_beta=0.25))
    assert (fn, hp, averaged) == (dpo_ipo_loss, {"beta": 0.25}, True)


def test_the_registered_ipo_loss_by_hand():
    # h = (logp_c - ref_c) - (logp_r - ref_r) = (-1 - -2) - (-3 - -2.5) = 1 + 0.5 = 1.5; beta 0.25:
    # (h - 1/(2 beta))^2 = (1.5 - 2)^2 = 0.25
    loss, _ = PREFERENCE_LOSSES.get("ipo")(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]),
                                           torch.tensor([-2.5]), beta=0.25)
    assert torch.allclose(loss, torch.tensor([0.25]))
