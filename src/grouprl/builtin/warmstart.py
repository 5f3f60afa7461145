"""Built-in models that need no download: a tiny Qwen2 causal LM warm-started by a short, deterministic SFT.

``builtin_model_path("arithmetic")`` returns a directory that ``AutoModelForCausalLM.from_pretrained``
and ``AutoTokenizer.from_pretrained`` load exactly like a hub model. The first call builds it:

1. a byte-level BPE tokenizer trained on the task's text, digits split one per token (:mod:`grouprl.builtin.tiny`);
2. a randomly initialised ``Qwen2ForCausalLM`` (hidden 128, 3 layers, ~0.8M parameters);
3. supervised fine-tuning on demonstrations ``<think>23+45=68</think>Answer: 68`` for a fixed
   number of steps -- deliberately SHORT, so the model knows the output format but gets only some answers
   right, and sampling at temperature 1 gives groups with mixed rewards: the starting point GRPO needs.

The result is cached under ``<cache_dir>/warmstart/<name>-<hash>`` where the hash covers every SFT
setting (and a format version), so changing a setting rebuilds and an unchanged one is loaded in a
second. ``cache_dir`` defaults to ``$GROUPRL_CACHE`` when set, else the user cache directory
``$XDG_CACHE_HOME/grouprl`` (``~/.cache/grouprl`` when ``XDG_CACHE_HOME`` is unset) -- never the current
folder, so runs started from different folders share one build. Building is deterministic
(fixed seeds, data order, one thread count, ``torch.use_deterministic_algorithms``): the same settings
give the same weights on the same software stack.

Built-in names (see ``WARMSTARTS``):

- ``arithmetic``: the default ``make run`` model (clean demonstrations, brief SFT).
- ``arithmetic-noisy``: demonstrations with 30% wrong answers (off by one / ten / digits swapped) --
  the start of the "online RL can exceed its data" recipe.
- ``countdown``: the countdown task.
- ``calculator``: a tool user for ``What is 4817 * 36 + 529?`` (recipes/agent_calculator.yaml). Its
  demonstrations are chat conversations rendered by the tiny chat template, token for token as the
  multi-turn rollout (:mod:`grouprl.rollout.multiturn`) builds them; the loss covers only the assistant
  turns, never the tool's reply. 90% call the calculator and copy its result
  (``<tool_call>calculator(expression="4817 * 36 + 529")</tool_call>``, tool: ``173941``,
  ``Answer: 173941``), but only 2.5% of those calls train the first token, the choice to call
  (``decision_fraction``); the rest answer at once, with the digits of their answer untrained
  (``mask_direct_digits``: the tiny model cannot compute them). So the skill (copying) is learned from
  every call and the policy (calling in about a quarter of samples) from a few: GRPO learns to call.
  Its SFT stops at a quality gate rather than a step count (``copy_gate``): once 90% of unseen problems are
  solved greedily after the choice to call, checked every 100 steps, at most ``sft_steps`` = 5,000. An
  attempt still below 0.05 at step 1,500 (a plateau: seed 2's first copied the expression, never the reply)
  restarts from a new initialisation (``gate_restart_after``), at most 3 attempts.
- ``code_repair``: a repair agent for the ``python`` environment (recipes/code_repair.yaml): view the file,
  edit one operator, run the tests, stop when they pass (:mod:`grouprl.builtin.code_demos`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from grouprl.builtin.cache_check import INFO_FILE, cache_damage, file_digests
from grouprl.builtin.cache_check import discard as _discard
from grouprl.builtin.sft import deterministic_torch, encode, plateaued, sft
from grouprl.errors import UnknownNameError

# Bump when the build procedure changes in a way the settings do not capture. 2: the tokenizer's
# <think>/<answer>/<tool_call> tags are no longer special (same ids and weights; the saved tokenizer differs).
FORMAT_VERSION = 2


@dataclass(frozen=True)
class WarmStart:
    """Everything that determines a built-in model; its hash names the cache entry."""

    task: str = "arithmetic"
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    noise: float = 0.0
    """Fraction of demonstrations whose answer is replaced by a plausible wrong one."""
    direct_fraction: float = 0.0
    """Fraction of demonstrations that give the answer alone, without the ``<think>`` working."""
    hasty_error: float = 0.0
    """Fraction of the answer-only demonstrations that stop after the first operation (a hasty
    solver's mistake: for "7 bags of 3 and eats 5" it answers 21)."""
    vocab_size: int = 400
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    sft_rows: int = 4000
    sft_steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 20
    seed: int = 0
    threads: int = 1
    """Torch CPU threads during the build (fixed, so floating-point reductions are repeatable)."""
    environment: str = ""
    """``""``: single-turn text demonstrations (prompt + completion). ``"calculator"``: chat
    demonstrations for the multi-turn rollout, some calling the calculator tool (see ``tool_fraction``);
    ``noise`` is then the fraction of tool calls with a mistyped expression. ``"python"``: code-repair chats
    (grouprl.builtin.code_demos), ``noise`` the fraction of failed test runs after which a demonstration stops
    instead of editing again."""
    tool_fraction: float = 0.0
    """With ``environment``: fraction of demonstrations that call the tool; the others answer directly."""
    no_tools_fraction: float = 0.0
    """With ``environment``: fraction of the direct answers shown a prompt that lists no tools (so the
    model also knows what to do when the tool is off: the baseline of the tool recipe)."""
    demo_version: int = 0
    """Bumped when a demonstration module's conversations change (``judge`` 1: each answer fenced by a
    random tag, as the judge reward now sends it), so the cached build is rebuilt. ``python`` 2: after a
    failed test run a demonstration views the file again before it edits again (grouprl.builtin.code_demos)."""
    mask_direct_digits: bool = False
    """With ``environment``: the digits of direct answers get loss mask 0 (only the "Answer: " format and
    the end of turn are trained), so what follows "Answer:" is learned from copied tool replies alone."""
    decision_fraction: float = 1.0
    """With ``environment``: fraction of the tool-call demonstrations whose first token (``<tool_call>``,
    the choice to call) is trained; the others train only the call and the answer. Decouples the skill
    (copying, learned from every call) from the policy (how often to call, learned from a few), so a
    warm start can copy reliably and still call rarely: the choice RL then learns. ``"python"``: the
    fraction of the turns after a failed test run that go on whose first token (the choice to go on
    rather than stop) is trained (grouprl.builtin.code_demos)."""
    max_positions: int = 512
    """Positions the model declares (``max_position_embeddings``). RoPE has no position weights, so this
    changes no weight, only the context ``grouprl serve`` and generation allow: the judge, whose prompts
    hold a fenced answer, declares more than the 512 of the other built-in models."""
    copy_gate: float = 0.0
    """Calculator: stop the SFT at the first check (every ``gate_every`` steps) where
    :func:`grouprl.builtin.agent_demos.copy_gate` reaches this; ``sft_steps`` is then the cap (and the
    cosine schedule's length). 0: exactly ``sft_steps`` steps."""
    gate_every: int = 100
    gate_restart_after: int = 0
    """With ``copy_gate``: an attempt whose gate score is still below ``gate_restart_below`` at this SFT step (a
    multiple of ``gate_every``) is a plateau (:func:`grouprl.builtin.sft.plateaued`): the SFT starts again from a
    new initialisation and data order (seed ``seed + 1000 x attempt``, the same demonstrations), at most
    ``gate_attempts`` attempts in all; the last one runs to the cap. 0: never restart."""
    gate_restart_below: float = 0.05
    gate_attempts: int = 3
    hint: float = 0.0
    """``"python"``: the probability that a demonstration's first edit writes the operator the function's name
    asks for (otherwise one of the three candidates at random, the right one included), so the warm start is
    right on its first edit ``hint + (1 - hint) / 3`` of the time and its choice already depends on the name
    -- the prior GRPO sharpens (grouprl.builtin.code_demos). 0: the choice ignores the name."""

    def digest(self) -> str:
        settings = asdict(self)
        for name in _LATER_FIELDS:  # fields added after FORMAT_VERSION 2 enter the hash only when set
            if settings[name] == _LATER_FIELDS[name]:
                del settings[name]
        blob = json.dumps({"v": FORMAT_VERSION, **settings}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


_LATER_FIELDS = {"environment": "", "tool_fraction": 0.0, "no_tools_fraction": 0.0, "demo_version": 0,
                 "mask_direct_digits": False, "decision_fraction": 1.0, "max_positions": 512, "copy_gate": 0.0,
                 "gate_every": 100, "gate_restart_after": 0, "gate_restart_below": 0.05, "gate_attempts": 3,
                 "hint": 0.0}


WARMSTARTS: dict[str, WarmStart] = {
    "arithmetic": WarmStart(direct_fraction=0.6, hasty_error=0.5),
    "arithmetic-noisy": WarmStart(noise=0.3),
    "countdown": WarmStart(task="countdown", sft_steps=600),
    # 90% of the demonstrations copy an expression into a call and its reply into the answer (the skill);
    # only 2.5% of those train the choice to call, so the warm start calls in about a third of its samples
    # (the policy GRPO then learns). Direct answers train "Answer: " but not digits the model cannot compute.
    # A quality gate, not a step count: where the copy is learned depends on the seed and the CPU's rounding
    # (at 2,000 fixed steps one seed of three did not copy); the SFT stops once copy_gate >= 0.9, cap 5,000.
    # Some initialisations plateau instead (seed 2: the expression copied from step 300, the reply never by
    # step 2,500): a gate still < 0.05 at step 1,500 restarts from a new initialisation, at most 3 attempts.
    "calculator": WarmStart(task="calculator", environment="calculator", tool_fraction=0.9, noise=0.0,
                            no_tools_fraction=0.5, sft_rows=16000, sft_steps=5000, mask_direct_digits=True,
                            decision_fraction=0.025, copy_gate=0.9, gate_restart_after=1500),
    # reasoning-gym basic_arithmetic, a op b with one-digit operands and + - * (recipes/reasoning_gym.yaml); every
    # demonstration is right, but half give the bare number without reasoning-gym's <answer> tag (scored 0)
    "reasoning-gym-arithmetic": WarmStart(task="reasoning_gym:basic_arithmetic", task_kwargs=dict(
        min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+", "-", "*"], allow_parentheses=False,
        allow_negation=False), direct_fraction=0.5, sft_rows=3000, sft_steps=600),
    # guess-the-number (recipes/guess_number.yaml): 70% of the demonstrated players guess at random, 30% bisect;
    # demo_version 1: the replies state the range left ("higher: 5 to 8")
    "guess-number": WarmStart(task="arithmetic", environment="guess_number", noise=0.7, sft_rows=3000,
                              sft_steps=800, vocab_size=300, demo_version=1),
    "judge": WarmStart(task="retrieval", environment="judge", vocab_size=500, sft_rows=6000, sft_steps=2000,
                       batch_size=16, demo_version=1, max_positions=2048),
    "retriever": WarmStart(task="retrieval", environment="search", vocab_size=500, noise=0.25, sft_rows=2000,
                           sft_steps=300, batch_size=16),
    # code repair (recipes/code_repair.yaml): view, edit one operator, run the tests; after a failure 30% of the
    # demonstrations edit again, 70% (noise) stop. The first edit follows the function's name in half of them
    # (hint 0.25: 0.25 + 0.75 / 3), the other operators a sixth each: the prior RL sharpens. A skill gate, not a step
    # count: the SFT stops once 90% of unseen repairs (retries included) copy greedily (grouprl.builtin.code_demos)
    "code_repair": WarmStart(task="code_repair", environment="python", noise=0.7, sft_rows=3000, sft_steps=3000,
                             batch_size=16, copy_gate=0.9, hint=0.25),
}


def default_cache_dir() -> Path:
    """``$GROUPRL_CACHE``, else ``$XDG_CACHE_HOME/grouprl``, else ``~/.cache/grouprl`` (one rule for every
    cache of grouprl: :func:`grouprl.data.prefs.cache_root`)."""
    from grouprl.data.prefs import cache_root

    return cache_root()


def get_warmstart(name: str) -> WarmStart:
    if name not in WARMSTARTS:
        from grouprl.errors import did_you_mean

        raise UnknownNameError(
            f"unknown built-in model 'builtin:{name}'. Known: "
            f"{', '.join('builtin:' + k for k in sorted(WARMSTARTS))}.{did_you_mean(name, WARMSTARTS)}"
        )
    return WARMSTARTS[name]


def builtin_model_path(name: str, cache_dir: str | os.PathLike | None = None, **overrides) -> str:
    """Directory of the built-in model ``name`` (built and cached on first use), for ``from_pretrained``.

    ``overrides`` replace :class:`WarmStart` fields (e.g. ``sft_steps=10`` in tests); they are part of
    the cache key.
    """
    spec = replace(get_warmstart(name), **overrides) if overrides else get_warmstart(name)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "warmstart" / f"{name}-{spec.digest()}"
    if (target / INFO_FILE).exists():
        damage = cache_damage(target)
        if damage is None:
            return str(target)
        print(f"grouprl: the cached builtin:{name} in {target} is damaged ({damage}); rebuilding it",
              file=sys.stderr, flush=True)
        _discard(target)
    from grouprl.data.prefs import building

    with building(target, INFO_FILE) as tmp:
        tmp.chmod(0o755)
        steps = f"SFT to copy gate {spec.copy_gate:g}, <= {spec.sft_steps} steps" if spec.copy_gate else \
            f"{spec.sft_steps} SFT steps"
        if spec.copy_gate and spec.gate_restart_after:
            steps += (f"; a new initialisation if still < {spec.gate_restart_below:g} at step {spec.gate_restart_after},"
                      f" {spec.gate_attempts} attempts at most")
        print(f"grouprl: building builtin:{name} (tiny Qwen2 + {steps}, once; cached in {target})",
              file=sys.stderr, flush=True)
        build_warmstart(spec, tmp, name=name)
    return str(target)


def reasoning_gym_examples(spec: WarmStart) -> tuple[list[tuple[str, str]], float]:
    """``(question, "<answer>A</answer>")`` demonstrations of a reasoning-gym task (``task:
    "reasoning_gym:<name>"``, ``task_kwargs`` its config), ``noise`` of them with a plausible wrong answer and
    ``direct_fraction`` with the bare answer ``A`` (no tag: reasoning-gym's extraction finds no answer there);
    drawn with ``seed = 1000 + spec.seed`` (the recipes train on other seeds)."""
    from grouprl.data.reasoning_gym import load_reasoning_gym
    from grouprl.data.tasks import plausible_wrong_answer

    config = {**spec.task_kwargs, "size": spec.sft_rows, "seed": 1000 + spec.seed}
    rows = load_reasoning_gym(spec.task.split(":", 1)[1], "train", **config)
    rng = random.Random(f"noise|{spec.seed}")
    examples, right = [], 0
    for row in rows:
        wrong = plausible_wrong_answer(row, rng) if rng.random() < spec.noise else None
        tagged = rng.random() >= spec.direct_fraction
        right += (wrong is None or wrong == row["answer"]) and tagged
        text = row["answer"] if wrong is None else wrong
        examples.append((row["prompt"], f"<answer>{text}</answer>" if tagged else text))
    return examples, right / len(examples)


def sft_examples(spec: WarmStart) -> tuple[list[tuple[str, str]], float]:
    """``(prompt, completion)`` demonstrations and the fraction of them whose answer is right."""
    from grouprl.data.tasks import demonstration, generate_rows, plausible_wrong_answer

    if spec.task.startswith("reasoning_gym:"):
        return reasoning_gym_examples(spec)

    rows = generate_rows(spec.task, "train", n=spec.sft_rows, seed=1000 + spec.seed, **spec.task_kwargs)
    rng = random.Random(f"noise|{spec.seed}")
    examples, right = [], 0
    for row in rows:
        wrong = plausible_wrong_answer(row, rng) if rng.random() < spec.noise else None
        show_work = rng.random() >= spec.direct_fraction
        if not show_work and rng.random() < spec.hasty_error:
            wrong = row["work"].split(", ")[0].rsplit("=", 1)[1]  # the first step's result
        right += wrong is None or wrong == row["answer"]
        examples.append((row["prompt"], demonstration(spec.task, row, wrong_answer=wrong, show_work=show_work)))
    return examples, right / len(examples)


def built_tokenizer(spec: WarmStart):
    """The tokenizer the build trains for ``spec`` (before :func:`grouprl.builtin.tiny.loaded_tokenizer`)."""
    from grouprl.builtin.tiny import build_tokenizer
    from grouprl.data.tasks import corpus

    if spec.environment:
        return _demos(spec.environment).demo_tokenizer(spec)
    if spec.task.startswith("reasoning_gym:"):  # the tokenizer learns the demonstrations' own text
        return build_tokenizer([p + c for p, c in reasoning_gym_examples(spec)[0]], vocab_size=spec.vocab_size)
    return build_tokenizer(corpus(spec.task), vocab_size=spec.vocab_size)


def sft_encoded(spec: WarmStart, tok) -> tuple[list[tuple[list[int], list[int]]], float]:
    """The SFT rows of ``spec`` as ``(ids, loss mask)`` under ``tok``, and the demonstrations' accuracy."""
    if not spec.environment:
        examples, demo_accuracy = sft_examples(spec)
        return encode(tok, examples), demo_accuracy
    from grouprl.builtin.agent_demos import encode_conversations

    demos = _demos(spec.environment)
    conversations, demo_accuracy = demos.demo_examples(spec)
    return getattr(demos, "demo_encode", encode_conversations)(tok, conversations), demo_accuracy


def build_warmstart(spec: WarmStart, out_dir: str | os.PathLike, *, name: str = "custom") -> Path:
    """Build tokenizer + tiny model, run the short SFT of ``spec`` and ``save_pretrained`` into ``out_dir``."""
    import torch

    from grouprl.builtin.tiny import loaded_tokenizer, save_tiny

    t0 = time.perf_counter()
    with deterministic_torch(spec.threads):
        tok = built_tokenizer(spec)
        model = _tiny_model(spec, tok, spec.seed)
        tok = loaded_tokenizer(tok, model)
        encoded, demo_accuracy = sft_encoded(spec, tok)
        gate = _gate(spec, tok) if spec.copy_gate else None
        model, losses, checks, attempts = _train(model, tok, encoded, spec, gate)
    model.eval()
    out = save_tiny(out_dir, tok, model)
    info = {
        "name": name,
        "settings": asdict(spec),
        "digest": spec.digest(),
        "demo_accuracy": demo_accuracy,
        "sft_loss_first": losses[0],
        "sft_loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "build_seconds": round(time.perf_counter() - t0, 1),
        **({"sft_steps_run": len(losses), "gate": checks, "gate_passed": checks[-1][1] >= spec.copy_gate,
            "sft_steps_total": sum(a["steps"] for a in attempts), "gate_attempts": attempts} if gate else {}),
        "torch": torch.__version__,
        "files": file_digests(Path(out)),
    }
    (Path(out) / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return Path(out)


def _tiny_model(spec: WarmStart, tok, seed: int):
    """The randomly initialised tiny Qwen2 of ``spec`` (initialisation seed ``seed``)."""
    from grouprl.builtin.tiny import build_tiny_model

    return build_tiny_model(tok, hidden_size=spec.hidden_size, num_layers=spec.num_layers, num_heads=spec.num_heads,
                            num_kv_heads=spec.num_kv_heads, max_position_embeddings=spec.max_positions, seed=seed)


def _train(model, tok, encoded, spec: WarmStart, gate):
    """The SFT of ``spec``. A gated one whose attempt :func:`~grouprl.builtin.sft.plateaued` starts again from a
    new model (seed ``spec.seed + 1000 x attempt``, that seed's data order too; the demonstrations stay those of
    ``spec.seed``), at most ``spec.gate_attempts`` attempts, the last without the restart rule. Attempt 0 is
    exactly the SFT without the rule, so a build that passes before ``gate_restart_after`` is unchanged by it.
    Returns the model, the final attempt's losses and checks, and ``{"seed", "steps", "checks"}`` per attempt."""
    attempts: list[dict] = []
    for k in range(spec.gate_attempts if gate is not None else 1):
        seed = spec.seed + 1000 * k
        if k:
            model = _tiny_model(spec, tok, seed)
        last = gate is None or k + 1 == spec.gate_attempts
        run = replace(spec, seed=seed, gate_restart_after=0 if last else spec.gate_restart_after)
        losses, checks = sft(model, encoded, run, pad_id=tok.pad_token_id, gate=gate)
        attempts.append({"seed": seed, "steps": len(losses), "checks": checks})
        if not (gate is not None and plateaued(checks, run)):
            break
        print(f"grouprl: copy gate still {checks[-1][1]:.2f} < {spec.gate_restart_below:.2f} at SFT step "
              f"{checks[-1][0]}: a plateau; restarting the SFT from a new initialisation (seed {seed + 1000}, "
              f"attempt {k + 2} of {spec.gate_attempts})", file=sys.stderr, flush=True)
    return model, losses, checks, attempts


def _demos(environment: str):
    """The module that builds the chat demonstrations (``demo_tokenizer``, ``demo_examples``) of ``environment``."""
    from grouprl.builtin import agent_demos, code_demos, game_demo, judge_demo, search_demo

    modules = {"calculator": agent_demos, "judge": judge_demo, "search": search_demo, "guess_number": game_demo,
               "python": code_demos}
    if environment not in modules:
        raise ValueError(f"WarmStart.environment={environment!r}: known demonstrations: {', '.join(modules)}")
    return modules[environment]


def _gate(spec: WarmStart, tok):
    """The ``score(model)`` of a gated build; a clear error where ``copy_gate`` cannot apply."""
    demos = _demos(spec.environment) if spec.environment else None
    if not hasattr(demos, "demo_gate") or not 0 < spec.copy_gate <= 1 or spec.gate_every < 1:
        raise ValueError(f"WarmStart.copy_gate={spec.copy_gate!r} (gate_every={spec.gate_every!r}) needs a value in "
                         f"(0, 1], gate_every >= 1 and environment 'calculator' or 'python' (got {spec.environment!r})")
    restart = spec.gate_restart_after
    if spec.gate_attempts < 1 or restart < 0 or restart % spec.gate_every:
        raise ValueError(f"WarmStart.gate_restart_after={restart!r} (gate_attempts={spec.gate_attempts!r}) needs 0 or "
                         f"a multiple of gate_every={spec.gate_every} (a step the gate is checked at), and "
                         f"gate_attempts >= 1")
    return demos.demo_gate(spec, tok)
