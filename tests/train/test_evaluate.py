"""Held-out accuracy and pass@k from fixed completions, against hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grouprl.train.evaluate import evaluate


class FixedBackend:
    """Returns prepared completions (4 per prompt) instead of sampling."""

    def __init__(self, completions):
        self.completions, self.calls = completions, []

    def generate(self, texts, n, params):
        self.calls.append((texts, n, params.temperature))
        out = [c for t in texts for c in self.completions[t]]
        mask = torch.tensor([[1] * len(c) + [0] * (3 - len(c)) for c in out])
        return SimpleNamespace(completions=out, completion_mask=mask)


def exact(completions, answer, **kw):
    return [None if a is None else float(c == a) for c, a in zip(completions, answer)]


def test_accuracy_and_pass_at_k_by_hand():
    backend = FixedBackend({"2+2=": ["4", "4", "x", "yy"], "3+4=": ["x", "7", "x", "x"], "?": ["a", "b", "c", "d"]})
    rows = [{"prompt": "2+2=", "answer": "4"}, {"prompt": "3+4=", "answer": "7"}, {"prompt": "?", "answer": None}]
    result = evaluate(backend, None, rows, exact, prompt_column="prompt", system_prompt=None, max_new_tokens=3,
                      max_prompt_length=None, temperature=0.7, num_samples=4, batch_size=2, ks=(1, 2, 4))
    # rewards 1,1,0,0 | 0,1,0,0 | None x4 (no opinion: left out of the mean) -> accuracy 3/8
    assert result["accuracy"] == pytest.approx(3 / 8) and result["num_scored"] == 8 and result["num_prompts"] == 3
    # pass@k = mean over the judged prompts of 1 - C(n-c,k)/C(n,k), n=4, c = 2, 1 (the third has no opinion)
    # k=1: (2/4 + 1/4) / 2;  k=2: (1 - 1/6 + 1 - 3/6) / 2;  k=4: (1 + 1) / 2
    assert result["pass@1"] == pytest.approx(0.375)
    assert result["pass@2"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert result["pass@4"] == 1.0
    assert result["completion_length"] == pytest.approx(13 / 12)  # one 2-token completion among 12
    assert [(n, t) for _, n, t in backend.calls] == [(4, 0.7), (4, 0.7)]  # batches of 2 prompts


def test_logged_eval_accuracy_is_reproduced_by_grouprl_eval(tiny_model_dir, tmp_path, capsys):
    """In-training evaluation and ``grouprl eval`` on the saved model give the identical number (sampled
    decoding with top_p < 1, so both the sampling settings and the random stream must agree)."""
    import json
    from pathlib import Path

    from train_helpers import read_metrics

    from grouprl.cli import main

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (data / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:3]))
    recipe = Path(__file__).parent / "recipes" / "tiny_grpo.yaml"
    out = tmp_path / "run"
    overrides = [f"model={tiny_model_dir}", f"dataset={data}", f"output_dir={out}", "max_steps=1",
                 "eval_reward=train_helpers:alpha_fraction", "eval_temperature=1.0", "eval_num_samples=2",
                 "top_p=0.7", "eval_before_train=false"]
    assert main(["train", "-c", str(recipe), *overrides]) == 0
    logged = next(r for r in read_metrics(out) if r.get("eval/tag") == "after")
    capsys.readouterr()
    assert main(["eval", "-c", str(out / "config.yaml"), "--checkpoint", str(out / "final"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.0 < logged["eval/accuracy"] < 1.0  # a continuous reward: equality below is not a coincidence
    assert result["accuracy"] == logged["eval/accuracy"]
    assert result["completion_length"] == logged["eval/completion_length"]
