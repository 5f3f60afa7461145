"""``grouprl explain``: one HTML page explaining three pieces of the algorithm with numbers computed by the
library's own registered functions (``grouprl.algo``), never re-derived for the page.

1. The group-relative advantage (GRPO, arXiv 2402.03300, Sec. 4.1.2; Dr. GRPO, arXiv 2503.20783; RLOO,
   arXiv 2402.14740) for example reward groups. The page lets the reader type a group; that uses a ten-line
   JavaScript z-score, which a test checks against ``ADVANTAGES`` on the embedded examples.
2. The clipped objective min(r A, clip(r, 1-eps_low, 1+eps_high) A) (PPO, arXiv 1707.06347, Eq. 7) as a
   function of the ratio, for A > 0 and A < 0, with its gradient; and token-level GRPO against
   sequence-level GSPO (arXiv 2507.18071, Eqs. 5-7) when one token of a sequence moves.
3. The k1/k2/k3 KL estimators (Schulman 2020; k3 is GRPO's, arXiv 2402.03300, Eq. 4) per sample, and
   their expectation and spread against the exact KL between two categorical distributions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ADV_EXAMPLES = [[1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0], [1, 3, 2, 6], [0.2, 0.5, 0.9, 0.1], [1, 1, 1, 1],
                [0, 0.5, 1, 1, 0.5, 0, 1, 1]]
ADV_METHODS = {"grpo": ("grpo", {}), "grpo (std unbiased)": ("grpo", {"std": "unbiased"}),
               "dr_grpo": ("dr_grpo", {}), "rloo": ("rloo", {})}
RATIOS = [round(0.02 * i, 4) for i in range(1, 126)]  # 0.02 .. 2.5
SEQ_LEN = 4
LOG_RATIOS = [round(-3 + 0.05 * i, 4) for i in range(121)]  # log(pi_ref / pi_theta)
SHIFTS = [round(-3 + 0.1 * i, 4) for i in range(61)]
KL_LOGITS = [0.5, 0.0, -0.5, 1.0, -1.0]
KL_DIRECTION = [1.0, -1.0, 0.5, 0.0, -0.5]


def advantage_data() -> dict[str, Any]:
    import torch

    from grouprl.registry import ADVANTAGES

    rows = []
    for rewards in ADV_EXAMPLES:
        r = torch.tensor([rewards], dtype=torch.float64)
        rows.append({"rewards": rewards, "adv": {label: ADVANTAGES.get(name)(r, **hp)[0].tolist()
                                                 for label, (name, hp) in ADV_METHODS.items()}})
    return {"methods": list(ADV_METHODS), "examples": rows, "eps": 1e-8}


def _objective(loss: str, ratios: list[float], adv: float, varied_only: bool, **hp) -> dict[str, list[float]]:
    """Objective (= -aggregated loss) and its gradient w.r.t. the varied token's log-prob, per ratio.

    varied_only=False: a one-token sequence with ratio r. True: a SEQ_LEN-token sequence whose first token
    has ratio r and the others ratio 1 (token-level GRPO clips only that token; GSPO's sequence ratio is
    r^(1/SEQ_LEN))."""
    import torch

    from grouprl.registry import AGGREGATIONS, POLICY_LOSSES

    n, t = len(ratios), SEQ_LEN if varied_only else 1
    logp = torch.zeros(n, t, dtype=torch.float64)
    logp[:, 0] = torch.log(torch.tensor(ratios, dtype=torch.float64))
    logp.requires_grad_(True)
    old, mask = torch.zeros(n, t, dtype=torch.float64), torch.ones(n, t, dtype=torch.float64)
    a = torch.full((n,), float(adv), dtype=torch.float64)
    per_token, _ = POLICY_LOSSES.get(loss)(logp, old, a, mask, **hp)
    # seq_mean_token_mean of each sequence on its own: mean over its tokens
    objective = torch.stack([-AGGREGATIONS.get("seq_mean_token_mean")(per_token[i:i + 1], mask[i:i + 1])
                             for i in range(n)])
    (grad,) = torch.autograd.grad(objective.sum(), logp)
    return {"objective": objective.detach().tolist(), "grad": grad[:, 0].tolist()}


def objective_data() -> dict[str, Any]:
    token = {"grpo eps 0.2": ("grpo", {}), "grpo clip-higher 0.2/0.28": ("grpo", {"eps_high": 0.28})}
    seq = {"grpo (token-level)": ("grpo", {}), "gspo eps 3e-4/4e-4 (paper)": ("gspo", {}),
           "gspo eps 0.2": ("gspo", {"eps_low": 0.2, "eps_high": 0.2})}
    out: dict[str, Any] = {"ratios": RATIOS, "seq_len": SEQ_LEN, "token": {}, "sequence": {}}
    for sign, adv in (("A>0", 1.0), ("A<0", -1.0)):
        out["token"][sign] = {label: _objective(name, RATIOS, adv, False, **hp) for label, (name, hp) in token.items()}
        out["sequence"][sign] = {label: _objective(name, RATIOS, adv, True, **hp) for label, (name, hp) in seq.items()}
    return out


def kl_data() -> dict[str, Any]:
    import torch

    from grouprl.algo.kl import kl_categorical
    from grouprl.registry import KL_ESTIMATORS

    names = ["k1", "k2", "k3"]
    x = torch.tensor(LOG_RATIOS, dtype=torch.float64)
    per_sample = {k: KL_ESTIMATORS.get(k)(torch.zeros_like(x), x).tolist() for k in names}
    z, u = torch.tensor(KL_LOGITS, dtype=torch.float64), torch.tensor(KL_DIRECTION, dtype=torch.float64)
    logp = torch.log_softmax(z, -1)
    exact, mean, std = [], {k: [] for k in names}, {k: [] for k in names}
    for d in SHIFTS:
        ref_logp = torch.log_softmax(z + d * u, -1)
        p = logp.exp()
        exact.append(float(kl_categorical(p, ref_logp.exp())))
        for k in names:
            v = KL_ESTIMATORS.get(k)(logp, ref_logp)  # one value per category = per possible sample
            m = (p * v).sum()
            mean[k].append(float(m))
            std[k].append(float(((p * (v - m) ** 2).sum()).sqrt()))
    return {"log_ratios": LOG_RATIOS, "per_sample": per_sample, "shifts": SHIFTS, "exact": exact,
            "mean": mean, "std": std, "policy_logits": KL_LOGITS, "ref_direction": KL_DIRECTION}


BODY = """
<section id="advantage"><h2>1. Group-relative advantage</h2>
<p>Each prompt gets a group of G completions; a completion's advantage is its reward relative to its group.
GRPO divides by the group's standard deviation (a group of equal rewards gets 0: nothing to learn);
Dr. GRPO only subtracts the mean; RLOO subtracts the mean of the <i>other</i> completions. Type rewards:</p>
<p><input id="adv-input" size="40" value="1, 0, 0, 1, 0, 0, 0, 0"> <span id="adv-out" class="tok"></span></p>
<div id="adv-plot" class="plot"></div><h3>Examples computed by grouprl.algo.ADVANTAGES</h3><div id="adv-table"></div>
<pre id="js-check" hidden></pre></section>
<section id="objective"><h2>2. The clipped objective</h2>
<p>Per token, GRPO maximises min(r A, clip(r, 1-eps_low, 1+eps_high) A) with r = pi_theta/pi_old. Where the
curve is flat the gradient is zero: a token whose ratio already moved far enough in the advantage's direction
stops being pushed. Left: one token. Right: a sequence of <span id="seq-len"></span> tokens where one token's
ratio moves; token-level GRPO clips that token only, GSPO clips the whole sequence on its geometric-mean ratio.</p>
<div class="grid"><div id="obj-token" class="plot tall"></div><div id="obj-seq" class="plot tall"></div>
<div id="grad-token" class="plot tall"></div><div id="grad-seq" class="plot tall"></div></div></section>
<section id="kl"><h2>3. KL estimators: k1, k2, k3</h2>
<p>The KL penalty is estimated from the sampled tokens only. Left: each estimator's value for one sample, as
a function of log(pi_ref/pi_theta): k1 can be negative, k2 and k3 never are. Right: between a 5-way
categorical policy and references shifted by delta, the estimators' expectation under the policy against the
exact KL (k1 and k3 are unbiased: their means lie on it; k2 is biased) with +-1 std bands (k3's is smallest
near the reference).</p><div class="grid"><div id="kl-sample" class="plot"></div><div id="kl-mean" class="plot"></div></div></section>
"""


def explain_data() -> dict[str, Any]:
    return {"kind": "explain", "advantage": advantage_data(), "objective": objective_data(), "kl": kl_data()}


def build_explain(out: str | Path = "explain.html") -> Path:
    """Write the explainer page and return its path."""
    from grouprl.builtins import load_builtins
    from grouprl.report.identity import grouprl_version
    from grouprl.report.page import render

    load_builtins()
    path = Path(out)
    path.write_text(render("grouprl explainers", f"computed by grouprl {grouprl_version()}'s own functions",
                           BODY, explain_data(), "explain.js"), encoding="utf-8")
    return path
