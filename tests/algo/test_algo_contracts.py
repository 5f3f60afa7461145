"""Contract tests over every registered function (new entries are covered automatically)."""

from __future__ import annotations

import inspect
import pathlib

import pytest
import torch

from grouprl.builtins import load_builtins
from grouprl.registry import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, Registry

load_builtins()
D = torch.float64
RATIO_METRICS = {"ratio_mean", "ratio_min", "ratio_max", "clip_frac_low", "clip_frac_high", "clip_frac", "approx_kl"}
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ALGORITHMS.md"


def _batch(seed=0, n=4, t=5):
    torch.manual_seed(seed)
    logp = (-torch.rand(n, t, dtype=D) * 3).requires_grad_(True)
    old_logp = (logp + 0.3 * torch.randn(n, t, dtype=D)).detach()
    mask = (torch.arange(t) < torch.tensor([5, 2, 1, 4]).unsqueeze(-1)).long()
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=D)
    return logp, old_logp, adv, mask


def _check_metrics(metrics):
    """Any subset of metric names is fine; each value is a detached, finite 0-dim tensor."""
    assert isinstance(metrics, dict)
    for key, value in metrics.items():
        assert isinstance(key, str)
        assert isinstance(value, torch.Tensor) and value.dim() == 0 and torch.isfinite(value), key
        assert not value.requires_grad, key


def check_finite_output_and_metrics(fn):
    logp, old_logp, adv, mask = _batch()
    per_token, metrics = fn(logp, old_logp, adv, mask)
    assert per_token.shape == logp.shape
    assert torch.isfinite(per_token).all()
    assert (per_token[mask == 0] == 0).all()
    _check_metrics(metrics)


def check_masked_tokens_get_zero_gradient_even_with_garbage(fn):
    logp, old_logp, adv, mask = _batch()
    # padding positions hold garbage (inf / nan / huge) in both log-prob tensors
    garbage = torch.tensor([float("inf"), float("nan"), 1e4, -float("inf")], dtype=D)
    fill = garbage.repeat(logp.numel() // 4 + 1)[: logp.numel()].reshape(logp.shape)
    logp = torch.where(mask > 0, logp.detach(), fill).requires_grad_(True)
    old_logp = torch.where(mask > 0, old_logp, fill.flip(0))
    per_token, _ = fn(logp, old_logp, adv, mask)
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    assert torch.isfinite(grad).all()
    assert (grad[mask == 0] == 0).all()
    assert grad[mask == 1].abs().sum() > 0


def check_zero_advantage_gives_zero_gradient(fn):
    logp, old_logp, _, mask = _batch()
    per_token, _ = fn(logp, old_logp, torch.zeros(4, dtype=D), mask)
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    assert (grad == 0).all()


GARBAGE = [float("inf"), -float("inf"), float("nan")]


def _extreme_batch(log_ratio, dtype):
    """Real tokens whose log-ratio logp - old_logp is +-log_ratio (alternating signs, so every sequence
    has both), realistic logp; padding holds +inf / -inf / NaN in logp and old_logp."""
    logp, _, adv, mask = _batch()
    sign = torch.tensor([1.0, -1.0]).repeat(3)[:5].expand(4, 5)
    old_logp = logp.detach() - sign.to(D) * log_ratio
    fill = torch.tensor(GARBAGE * 7, dtype=D)[:20].reshape(4, 5)
    logp = torch.where(mask > 0, logp.detach(), fill).to(dtype).requires_grad_(True)
    old_logp = torch.where(mask > 0, old_logp, fill.flip(1)).to(dtype)
    return logp, old_logp, adv.to(dtype), mask


def check_extreme_log_ratios_stay_finite(fn, log_ratio, dtype, **hp):
    logp, old_logp, adv, mask = _extreme_batch(log_ratio, dtype)
    per_token, metrics = fn(logp, old_logp, adv, mask, **hp)
    assert torch.isfinite(per_token).all() and (per_token[mask == 0] == 0).all()
    (grad,) = torch.autograd.grad(AGGREGATIONS.get("token_mean")(per_token, mask), logp)
    assert torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()
    _check_metrics(metrics)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_finite_output_and_metrics(name):
    check_finite_output_and_metrics(POLICY_LOSSES.get(name))


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_masked_tokens_get_zero_gradient_even_with_garbage(name):
    check_masked_tokens_get_zero_gradient_even_with_garbage(POLICY_LOSSES.get(name))


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_zero_advantage_gives_zero_gradient(name):
    check_zero_advantage_gives_zero_gradient(POLICY_LOSSES.get(name))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("log_ratio", [100.0, 1000.0])
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_extreme_log_ratios_finite_values_and_gradients(name, log_ratio, dtype):
    # +-100 and +-1000 on real tokens, +-inf / NaN on padding; also with grpo's dual-clip and delta cap
    check_extreme_log_ratios_stay_finite(POLICY_LOSSES.get(name), log_ratio, dtype)
    if name == "grpo":
        check_extreme_log_ratios_stay_finite(POLICY_LOSSES.get(name), log_ratio, dtype, dual_clip=3.0)
        check_extreme_log_ratios_stay_finite(POLICY_LOSSES.get(name), log_ratio, dtype, delta=4.0)


def test_minimal_custom_loss_passes_the_contract():
    # A new loss need not take eps_low / eps_high nor return any ratio metric: REINFORCE, no metrics.
    reg = Registry("policy loss")

    @reg.register("reinforce")
    def reinforce(logp, old_logp, adv, mask):
        """REINFORCE: -A log pi (Williams 1992). Shapes: [N, T] x 2, [N], [N, T] -> ([N, T], {})."""
        safe = torch.where(mask > 0, logp, torch.zeros_like(logp))
        a = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [N] per sequence or [N, T] per token
        a = torch.where(mask > 0, a, torch.zeros_like(a))
        return -a * safe * mask.to(logp.dtype), {}

    fn = reg.get("reinforce")
    check_finite_output_and_metrics(fn)
    check_masked_tokens_get_zero_gradient_even_with_garbage(fn)
    check_zero_advantage_gives_zero_gradient(fn)
    check_token_advantages_equal_broadcast_sequence_advantages(fn)
    check_token_advantages_with_garbage_on_padding(fn)
    for log_ratio in (100.0, 1000.0):
        check_extreme_log_ratios_stay_finite(fn, log_ratio, torch.float32)


# ---- token-level advantages [N, T] (PPO's GAE) through every registered loss -------------------------
def check_token_advantages_equal_broadcast_sequence_advantages(fn):
    """adv [N, T] holding A_i at every token of sequence i is the same objective as adv [N] = A_i."""
    logp, old_logp, adv, mask = _batch()
    seq_loss, seq_metrics = fn(logp, old_logp, adv, mask)
    tok_loss, tok_metrics = fn(logp, old_logp, adv.unsqueeze(-1).expand_as(logp).clone(), mask)
    assert tok_loss.shape == logp.shape and torch.allclose(tok_loss, seq_loss, atol=1e-12)
    (g_seq,) = torch.autograd.grad(seq_loss.sum(), logp)
    (g_tok,) = torch.autograd.grad(tok_loss.sum(), logp)
    assert torch.allclose(g_tok, g_seq, atol=1e-12)
    for key in seq_metrics:
        assert tok_metrics[key].item() == pytest.approx(seq_metrics[key].item(), abs=1e-12), key


def check_token_advantages_with_garbage_on_padding(fn):
    """Token advantages that differ within a sequence; NaN / inf advantages on padding change nothing."""
    logp, old_logp, _, mask = _batch()
    torch.manual_seed(5)
    adv = torch.randn(logp.shape, dtype=D)
    per_token, metrics = fn(logp, old_logp, adv, mask)
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    garbage = torch.where(mask > 0, adv, torch.tensor(float("nan"), dtype=D))
    garbage[1, 4] = float("inf")  # row 1 has 2 real tokens: position 4 is padding
    per_token_g, metrics_g = fn(logp, old_logp, garbage, mask)
    (grad_g,) = torch.autograd.grad(per_token_g.sum(), logp)
    assert torch.isfinite(per_token_g).all() and torch.equal(per_token_g, per_token)
    assert torch.isfinite(grad_g).all() and torch.equal(grad_g, grad)
    assert (grad[mask == 0] == 0).all() and grad[mask == 1].abs().sum() > 0
    _check_metrics(metrics_g)
    zero, _ = fn(logp, old_logp, torch.zeros_like(adv), mask)
    (g0,) = torch.autograd.grad(zero.sum(), logp)
    assert (g0 == 0).all()  # zero token advantage: zero policy gradient


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_token_advantages_equal_broadcast_sequence_advantages(name):
    check_token_advantages_equal_broadcast_sequence_advantages(POLICY_LOSSES.get(name))


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_token_advantages_finite_masked_and_zero(name):
    check_token_advantages_with_garbage_on_padding(POLICY_LOSSES.get(name))


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_rejects_an_advantage_of_the_wrong_shape(name):
    logp, old_logp, _, mask = _batch()
    with pytest.raises(ValueError, match=r"adv must be \[N\]"):
        POLICY_LOSSES.get(name)(logp, old_logp, torch.zeros(4, 3, dtype=D), mask)


def test_token_advantage_moves_only_its_token_under_a_token_ratio():
    # grpo / cispo: token t's loss depends on token t's ratio only, so an advantage on one token gives a
    # gradient on that token alone; gspo's sequence ratio spreads it over the sequence (1/|y_i| each).
    logp, old_logp, _, mask = _batch()
    adv = torch.zeros(logp.shape, dtype=D)
    adv[0, 2] = 1.0
    for name in ("grpo", "cispo"):
        (g,) = torch.autograd.grad(POLICY_LOSSES.get(name)(logp, old_logp, adv, mask)[0].sum(), logp)
        assert g[0, 2] != 0 and (g.flatten().ne(0).sum() == 1), name
    (g,) = torch.autograd.grad(POLICY_LOSSES.get("gspo")(logp, old_logp, adv, mask, eps_low=0.5,
                                                          eps_high=10.0)[0].sum(), logp)
    assert (g[0, :5] != 0).all() and (g[1:] == 0).all()


@pytest.mark.parametrize("name", [n for n in POLICY_LOSSES.names() if n.startswith("gspo")])
def test_gspo_equals_grpo_when_one_token(name):
    # With T = 1 the sequence ratio is the token ratio, so GSPO (and GSPO-token) reduce to GRPO.
    torch.manual_seed(3)
    logp = (-torch.rand(6, 1, dtype=D) * 2).requires_grad_(True)
    old_logp = (logp + 0.3 * torch.randn(6, 1, dtype=D)).detach()
    adv = torch.randn(6, dtype=D)
    mask = torch.ones(6, 1)
    hp = {"eps_low": 0.2, "eps_high": 0.28}
    ours, m_ours = POLICY_LOSSES.get(name)(logp, old_logp, adv, mask, **hp)
    ref, m_ref = POLICY_LOSSES.get("grpo")(logp, old_logp, adv, mask, **hp)
    assert torch.allclose(ours, ref, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours.sum(), logp)
    (g_ref,) = torch.autograd.grad(ref.sum(), logp)
    assert torch.allclose(g_ours, g_ref, atol=1e-12)
    assert 0 < m_ref["clip_frac"].item() < 1
    for key in RATIO_METRICS:
        assert m_ours[key].item() == pytest.approx(m_ref[key].item(), abs=1e-12), key


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_advantage_contract(name):
    nan = float("nan")
    rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.5, nan, 1.5, 0.0]], dtype=D)
    adv = ADVANTAGES.get(name)(rewards)
    assert adv.shape == rewards.shape and torch.isfinite(adv).all()
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # flat group: nothing to learn
    assert adv[2, 1].item() == 0.0  # NaN reward: no opinion
    assert adv.sum(-1).tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)
    assert (adv[0] > 0).tolist() == [True, False, True, True]  # better than the group -> positive


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_advantage_nan_rewards_mixed_and_all_nan_groups(name):
    # NaN = no opinion: 0 advantage, and the group's statistics are those of the other rewards, so a
    # group with NaNs gives its valid members the same advantages as the group without the NaN entries.
    nan = float("nan")
    rewards = torch.tensor([[0.0, nan, 1.0, nan, 1.0], [nan] * 5, [nan, 3.0, nan, nan, nan]], dtype=D)
    adv = ADVANTAGES.get(name)(rewards)
    assert torch.isfinite(adv).all()
    assert adv[torch.isnan(rewards)].eq(0).all()
    assert adv[1:].eq(0).all()  # all-NaN group, and a group with one valid reward: no baseline
    alone = ADVANTAGES.get(name)(torch.tensor([[0.0, 1.0, 1.0]], dtype=D))[0]
    assert adv[0, [0, 2, 4]].tolist() == pytest.approx(alone.tolist(), abs=1e-12)


@pytest.mark.parametrize("name", AGGREGATIONS.names())
def test_aggregation_contract(name):
    per_token = torch.randn(3, 4, dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    out = AGGREGATIONS.get(name)(per_token, mask, num_tokens=8, num_seqs=3, max_len=4)
    assert out.dim() == 0 and torch.isfinite(out)
    (grad,) = torch.autograd.grad(out, per_token)
    assert (grad[mask == 0] == 0).all() and (grad[mask == 1] > 0).all()
    # a constant per-token loss c aggregates to c for the two mean aggregations
    ones = AGGREGATIONS.get(name)(torch.ones(3, 4, dtype=D), mask)
    expected = 8 / 12 if name == "seq_mean_token_sum_norm" else 1.0  # 8 real tokens / (3 seqs x 4)
    assert ones.item() == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("log_ratio", [100.0, 1000.0])
@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_kl_estimator_extreme_log_ratios_finite_values_and_gradients(name, log_ratio, dtype):
    # log(ref/pi) = +-100 / +-1000 on real tokens, +-inf / NaN on padding (in logp and ref_logp), reduced
    # with the mask the way the trainer does: value and gradient finite, padding gets no gradient.
    logp, ref_logp, _, mask = _extreme_batch(log_ratio, dtype)
    kl = KL_ESTIMATORS.get(name)(logp, ref_logp)
    assert torch.isfinite(kl[mask > 0]).all()
    for agg in AGGREGATIONS.names():
        out = AGGREGATIONS.get(agg)(kl, mask)
        (grad,) = torch.autograd.grad(out, logp, retain_graph=True)
        assert torch.isfinite(out) and torch.isfinite(grad).all(), agg
        assert (grad[mask == 0] == 0).all(), agg


@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_kl_estimator_contract(name):
    logp, old_logp, _, _ = _batch()
    kl = KL_ESTIMATORS.get(name)(logp, old_logp)
    assert kl.shape == logp.shape and torch.isfinite(kl).all()
    assert (KL_ESTIMATORS.get(name)(logp, logp.detach()) == 0).all()
    (grad,) = torch.autograd.grad(kl.sum(), logp)
    assert torch.isfinite(grad).all()
    if name != "k1":
        assert (kl >= 0).all()


REGISTRIES = {"advantages": ADVANTAGES, "policy_losses": POLICY_LOSSES, "aggregations": AGGREGATIONS,
              "kl_estimators": KL_ESTIMATORS}


@pytest.mark.parametrize("kind,name", [(k, n) for k, reg in REGISTRIES.items() for n in reg.names()])
def test_registered_function_is_documented(kind, name):
    # DESIGN.md rule 1/7: paper (arXiv id or source), equation and shapes in the docstring; a row in
    # docs/ALGORITHMS.md that names the function and the test.
    fn = REGISTRIES[kind].get(name)
    doc = inspect.getdoc(fn) or ""
    assert "Shapes" in doc, f"{name}: docstring lacks shapes"
    assert "arXiv" in doc or "Schulman 2020" in doc, f"{name}: docstring lacks the paper"
    text = DOCS.read_text(encoding="utf-8")
    assert f"`{name}`" in text and fn.__name__ in text, f"{name}: missing from docs/ALGORITHMS.md"
