"""The explainer page's numbers are grouprl.algo's (and match hand-computed values)."""

from __future__ import annotations

import math

import pytest
import torch

from grouprl.builtins import load_builtins
from grouprl.cli import main
from grouprl.registry import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.report.explain import ADV_METHODS, SEQ_LEN
from grouprl.report.page import parse_data


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    load_builtins()
    out = tmp_path_factory.mktemp("explain") / "explain.html"
    assert main(["explain", "-o", str(out)]) == 0
    return parse_data(out.read_text())


def test_advantages_equal_the_registry_and_hand_values(data):
    ex = {tuple(e["rewards"]): e["adv"] for e in data["advantage"]["examples"]}
    # [1, 3, 2, 6]: mean 3, population std sqrt(14/4)
    s = math.sqrt(14 / 4)
    assert ex[(1, 3, 2, 6)]["grpo"] == pytest.approx([-2 / s, 0, -1 / s, 3 / s], abs=1e-6)
    assert ex[(1, 3, 2, 6)]["dr_grpo"] == pytest.approx([-2, 0, -1, 3])
    assert ex[(1, 3, 2, 6)]["rloo"] == pytest.approx([-8 / 3, 0, -4 / 3, 4])
    assert ex[(1, 1, 1, 1)]["grpo"] == [0, 0, 0, 0]
    for rewards, adv in ex.items():
        for label, (name, hp) in ADV_METHODS.items():
            want = ADVANTAGES.get(name)(torch.tensor([rewards], dtype=torch.float64), **hp)[0].tolist()
            assert adv[label] == pytest.approx(want, abs=1e-12)


def test_clipped_objective_equals_the_loss_function(data):
    obj, ratios = data["objective"], data["objective"]["ratios"]
    tok = obj["token"]["A>0"]["grpo eps 0.2"]["objective"]
    i15, i05 = ratios.index(1.5), ratios.index(0.5)
    assert tok[i15] == pytest.approx(1.2) and tok[i05] == pytest.approx(0.5)  # min(r, clip(r)) * 1
    assert obj["token"]["A<0"]["grpo eps 0.2"]["objective"][i05] == pytest.approx(-0.8)
    assert obj["token"]["A>0"]["grpo clip-higher 0.2/0.28"]["objective"][i15] == pytest.approx(1.28)
    assert obj["token"]["A>0"]["grpo eps 0.2"]["grad"][i15] == 0.0  # clipped: no gradient
    assert obj["token"]["A>0"]["grpo eps 0.2"]["grad"][i05] == pytest.approx(0.5)  # d(r)/d(log r) = r
    seq = obj["sequence"]["A>0"]
    # one of SEQ_LEN tokens at r = 0.5, the rest at 1: GRPO averages (0.5 + 1 + 1 + 1)/4;
    # GSPO (eps 0.2) uses s = 0.5 ** (1/4) = 0.8409, inside the clip range
    assert seq["grpo (token-level)"]["objective"][i05] == pytest.approx((0.5 + SEQ_LEN - 1) / SEQ_LEN)
    assert seq["gspo eps 0.2"]["objective"][i05] == pytest.approx(0.5 ** (1 / SEQ_LEN))
    logp = torch.log(torch.tensor([[1.5] + [1.0] * (SEQ_LEN - 1)], dtype=torch.float64))
    loss, _ = POLICY_LOSSES.get("gspo")(logp, torch.zeros_like(logp), torch.tensor([1.0], dtype=torch.float64),
                                        torch.ones_like(logp))
    assert seq["gspo eps 3e-4/4e-4 (paper)"]["objective"][i15] == pytest.approx(-loss.mean().item())


def test_kl_estimators_equal_the_registry_and_k1_k3_are_unbiased(data):
    kl = data["kl"]
    x = torch.tensor(kl["log_ratios"], dtype=torch.float64)
    for k in ("k1", "k2", "k3"):
        assert kl["per_sample"][k] == pytest.approx(KL_ESTIMATORS.get(k)(torch.zeros_like(x), x).tolist())
    i = kl["log_ratios"].index(1.0)
    assert kl["per_sample"]["k3"][i] == pytest.approx(math.e - 1 - 1)  # r - 1 - log r at log r = 1
    assert kl["per_sample"]["k1"][i] == pytest.approx(-1.0) and kl["per_sample"]["k2"][i] == pytest.approx(0.5)
    assert kl["mean"]["k1"] == pytest.approx(kl["exact"], abs=1e-9)
    assert kl["mean"]["k3"] == pytest.approx(kl["exact"], abs=1e-9)
    assert kl["exact"][kl["shifts"].index(0.0)] == pytest.approx(0.0, abs=1e-12)
    j = kl["shifts"].index(1.0)
    assert kl["mean"]["k2"][j] != pytest.approx(kl["exact"][j], rel=1e-3)  # k2 is biased
