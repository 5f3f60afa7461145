"""Train a tiny reward model on synthetic preference pairs, then use it as the ``reward_model`` reward.

What it implements: the Bradley-Terry reward-model objective of Ouyang et al. (arXiv:2203.02155, §3.5,
eq. 1), ``loss = -log sigmoid(r(x, y_chosen) - r(x, y_rejected))``, on a randomly initialised tiny
Qwen2 sequence-classification model (one logit) built locally -- nothing is downloaded. The pairs come
from the built-in ``arithmetic`` task: the chosen answer is the correct demonstration
(``<think>7*3=21</think>Answer: 21``); the rejected one is either the same working with a careless wrong
result (off by one or ten, digits swapped) or an answer without the answer line. The model is saved with
``save_pretrained`` and then scored through ``make_reward_func("reward_model", path=...)``, the way a
recipe's ``reward_funcs: [reward_model]`` would use it.

What it leaves out: real preference data, a pretrained backbone, and a margin or regularisation term.

What to expect (measured with the defaults, 60 steps: 92 s of CPU time, on a 2-core machine shared with other jobs):
the training loss falls from 0.69 (chance) to 0.37, and the held-out pairwise accuracy is 1.0 on "no
answer line" rejections but 0.42 on "wrong result" ones -- telling a wrong sum from a right one needs the
model to check the arithmetic, which this size does not learn here. That is the reason a learned reward is
mixed with rule rewards (or checked by them) in the recipes.

    python examples/reward_model.py --out runs/tiny-rm
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from grouprl.builtin.tiny import build_tokenizer
from grouprl.builtins import load_builtins
from grouprl.data.tasks import corpus, demonstration, generate_rows, plausible_wrong_answer
from grouprl.rewards import make_reward_func


def preference_pairs(split: str, n: int, seed: int = 0) -> list[dict]:
    """``{"prompt", "chosen", "rejected", "kind"}`` rows from the arithmetic task (half of each kind)."""
    rng = random.Random(seed)
    pairs = []
    for i, row in enumerate(generate_rows("arithmetic", split, n=n, seed=seed)):
        chosen = demonstration("arithmetic", row)
        if i % 2 == 0:
            rejected, kind = demonstration("arithmetic", row, wrong_answer=plausible_wrong_answer(row, rng)), "wrong"
        else:
            rejected, kind = f"<think>{row['work']}</think>", "no_answer"
        pairs.append({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected, "kind": kind})
    return pairs


def build_reward_model(tokenizer, hidden_size: int = 64, num_layers: int = 2, seed: int = 0):
    """A random tiny ``Qwen2ForSequenceClassification`` with a single-logit head."""
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(config)


def _texts(tokenizer, prompts: list[str], answers: list[str]) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": a}],
                                          tokenize=False) for p, a in zip(prompts, answers)]


def _rewards(model, tokenizer, prompts: list[str], answers: list[str]) -> torch.Tensor:
    enc = tokenizer(_texts(tokenizer, prompts, answers), return_tensors="pt", padding=True, add_special_tokens=False)
    return model(**enc).logits[:, 0]


def train(model, tokenizer, pairs: list[dict], *, steps: int, batch_size: int = 8, lr: float = 1e-3,
          seed: int = 0) -> list[float]:
    """Bradley-Terry training; returns the loss of every step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        batch = rng.sample(pairs, min(batch_size, len(pairs)))
        prompts = [p["prompt"] for p in batch]
        margin = (_rewards(model, tokenizer, prompts, [p["chosen"] for p in batch])
                  - _rewards(model, tokenizer, prompts, [p["rejected"] for p in batch]))
        loss = -torch.nn.functional.logsigmoid(margin).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def pairwise_accuracy(reward_fn, pairs: list[dict]) -> dict[str, float]:
    """Fraction of held-out pairs the reward ranks chosen above rejected, per kind of rejection."""
    prompts = [p["prompt"] for p in pairs]
    chosen = reward_fn([p["chosen"] for p in pairs], prompts=prompts)
    rejected = reward_fn([p["rejected"] for p in pairs], prompts=prompts)
    out: dict[str, float] = {}
    for kind in sorted({p["kind"] for p in pairs}):
        idx = [i for i, p in enumerate(pairs) if p["kind"] == kind]
        out[kind] = sum(chosen[i] > rejected[i] for i in idx) / len(idx)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=200, help="training pairs")
    ap.add_argument("--hidden-size", type=int, default=32)
    ap.add_argument("--heldout", type=int, default=100, help="held-out pairs for the accuracy")
    ap.add_argument("--out", default="runs/tiny-rm", help="where the reward model is saved")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    t0 = time.time()
    tokenizer = build_tokenizer(corpus("arithmetic", n=500), vocab_size=256)
    tokenizer.padding_side = "right"
    model = build_reward_model(tokenizer, hidden_size=args.hidden_size)
    losses = train(model, tokenizer, preference_pairs("train", args.pairs), steps=args.steps,
                   batch_size=args.batch_size)
    model.eval()
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    load_builtins()  # registers "reward_model" (as the trainer does at start-up)
    reward = make_reward_func("reward_model", path=args.out)  # the reward a recipe would use
    result = {"first_loss": losses[0], "last_loss": sum(losses[-20:]) / len(losses[-20:]),
              "heldout_pairwise_accuracy": pairwise_accuracy(reward, preference_pairs("test", args.heldout)),
              "seconds": round(time.time() - t0, 1), "path": args.out}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
