"""``builtin:code_repair``: a tiny code-repair agent for recipes/code_repair.yaml, warm-started on repair chats.

Each demonstration is one rollout of the ``code_repair`` task (:mod:`grouprl.data.code_repair`) in the
``python`` environment, token for token as :mod:`grouprl.rollout.multiturn` builds it (ids and loss mask
from :func:`grouprl.builtin.agent_demos.conversation_ids`, the environment's own tool list in the prompt)::

    user       Fix add in solution.py.
    assistant  <tool_call>view()</tool_call>
    tool          1 | def add(a, b):\\n   2 |     return a - b
    assistant  <tool_call>edit(old="a - b", new="a * b")</tool_call>
    tool       edited solution.py (2 lines)
    assistant  <tool_call>run_tests()</tool_call>
    tool       0/3 tests passed.\\nFAILED test 0 `assert add(2, 7) == 9` (failed): AssertionError ...
    assistant  <tool_call>edit(old="a * b", new="a + b")</tool_call>      (edits again, or stops)
    ...        run_tests() -> 3/3 tests passed.
    assistant  Done.

The tool replies are the environment's own text (:class:`grouprl.envs.code_repair.CodeRepairEnv`'s
``view``, ``edit`` and report format); only the test verdicts are computed from the row instead of run in
the sandbox (:class:`DemoRepairEnv`), and a test checks that they equal the sandbox's.

SKILL and POLICY are separated as in the calculator warm start: every demonstration views the file,
copies the returned expression into ``edit(old=...)`` and writes it back with one operator changed, runs
the tests and stops once they pass (the skill: the syntax, the copying, reading ``3/3``). Which operator
to try is only hinted: with probability ``spec.hint`` the first edit writes the one the function's name asks
for, otherwise one of the three its family offers besides the wrong one at random, so the built-in (hint
0.25) is right on its first edit half the time (0.25 + 0.75 / 3) and its choice already depends on the
name -- the prior GRPO sharpens. After a failed run it edits again (another untried operator, copying its
own previous edit into ``old``) in ``1 - spec.noise`` of the cases and stops in ``spec.noise``; at most
``MAX_EDITS`` edits. What GRPO can learn: the operator the name asks for, and to edit again after a failure.
The SFT runs until :func:`repair_gate` (the skill, retries included, greedy on unseen files) reaches
``spec.copy_gate``.

Two options, off in the built-in ``code_repair``: ``spec.decision_fraction < 1`` trains the first token of
only that share of the turns that go on after a failure (the choice to go on rather than answer
``Done.``), as :mod:`grouprl.builtin.agent_demos` masks the calculator's choice to call, so more
demonstrations can edit again (the skill) while the warm start still goes on rarely (the policy left to
RL); ``spec.demo_version >= 2`` views the file again before each edit after a failure, so that every edit
copies from the view just before it. Measured (recipes/code_repair.yaml header): warm starts built with
them (noise 0.25 or 0.5, on FAIL_TO_PASS rows, 500 SFT steps, before the builds trained on the tokenizer their
checkpoint loads) miscopied 20-40% of their edits; not re-measured since.
"""

from __future__ import annotations

import random
from typing import Any

MAX_EDITS = 3  # the code template's "<= 3 file edits"
FINAL = "Done."


def repair_tools() -> list[dict]:
    """The ``python`` environment's tool schemas, exactly as a rollout passes them to the chat template."""
    from grouprl.envs import CodeRepairEnv, make_env_factory

    return make_env_factory(environment_factory=CodeRepairEnv)().tools


def demo_env_class():
    """:class:`CodeRepairEnv` whose test runs are computed from the row's ``work`` (no sandbox job): the
    same report text, for the thousands of demonstrations a warm start needs."""
    from types import SimpleNamespace

    from grouprl.data.code_repair import FUNCTIONS, passes
    from grouprl.envs import CodeRepairEnv

    class DemoRepairEnv(CodeRepairEnv):
        def reset(self, work: dict | None = None, **row: Any) -> None:
            self.work = work
            return super().reset(**row)

        def _run(self) -> Any:
            line = self.code.splitlines()[-1].split()
            op = line[2] if len(line) == 4 and line[2] in {o for o, _ in FUNCTIONS.values()} else None
            verdicts = passes(self.work, op) if op else [False] * len(self.work["cases"])
            # what grouprl.sandbox's SandboxResult / TestResult give the report for a failed assert
            tests = [SimpleNamespace(index=i, passed=ok, status="passed" if ok else "failed",
                                     reason="" if ok else "AssertionError") for i, ok in enumerate(verdicts)]
            self.passed, self.total = sum(verdicts), len(verdicts)
            return SimpleNamespace(passed=self.passed, total=self.total, status="ok", reason="", tests=tests,
                                   stdout="", stderr="", reward=self.passed / self.total)

    return DemoRepairEnv


def _call(name: str, **arguments: str) -> str:
    args = ", ".join(f'{k}="{v}"' for k, v in arguments.items())
    return f"<tool_call>{name}({args})</tool_call>"


def repair_conversation(row: dict, rng: random.Random, *, give_up: float, decide: float = 1.0, review: bool = False,
                        hint: float = 0.0, env: Any = None) -> list[dict]:
    """The messages of one demonstration for a ``code_repair`` row (module docstring): view, edit, run the
    tests, and after a failure edit again (probability ``1 - give_up``) until they pass or ``MAX_EDITS``.
    With ``review`` each edit after a failure follows a new ``view()`` (and copies from it; without, it copies
    its own previous ``new``). The first turn after a failure that goes on (that view, or the edit) trains
    its first token (the choice to go on) with probability ``decide``; the others are marked
    ``"mask_first"`` (loss mask 0 on that token). With ``hint > 0`` the first edit writes the operator the
    function's name asks for with probability ``hint`` (and otherwise a uniform one of the three, as without)."""
    from grouprl.data.code_repair import FAMILIES, expression

    work = row["work"]
    env = env if env is not None else demo_env_class()()
    env.reset(work=work, code=row["code"], tests=row["tests"])
    messages = [dict(m) for m in row["prompt"]]

    def step(content: str, name: str, result: str, mask_first: bool = False) -> None:
        messages.append({"role": "assistant", "content": content, **({"mask_first": True} if mask_first else {})})
        messages.append({"role": "tool", "name": name, "content": result})

    step(_call("view"), "view", env.view())
    args, current = tuple(work["args"]), work["bug"]
    untried = [o for o in FAMILIES[work["family"]] if o != current]
    for k in range(MAX_EDITS):
        masked = k > 0 and decide < 1.0 and rng.random() >= decide  # the choice to go on, untrained
        if k and review:  # after a failure: view the file again, then copy from that view
            step(_call("view"), "view", env.view(), mask_first=masked)
        if k == 0 and hint > 0 and rng.random() < hint:  # no draw without a hint: the built-in's chats stay as they were
            new = untried.pop(untried.index(work["op"]))
        else:
            new = untried.pop(rng.randrange(len(untried)))
        old_text, new_text = expression(args, current), expression(args, new)
        step(_call("edit", old=old_text, new=new_text), "edit", env.edit(old_text, new_text),
             mask_first=masked and not review)
        current = new
        step(_call("run_tests"), "run_tests", env.run_tests())
        if env.passed == env.total or not untried or rng.random() < give_up:
            break
    messages.append({"role": "assistant", "content": FINAL})
    return messages


def demo_examples(spec: Any) -> tuple[list[tuple[list[dict], list[dict]]], float]:
    """``spec.sft_rows`` demonstrations on the task's training split (seed ``1000 + spec.seed``) with the
    environment's tools, and the fraction whose final file passes every test."""
    from grouprl.data.tasks import generate_rows

    rows = generate_rows(spec.task, "train", n=spec.sft_rows, seed=1000 + spec.seed, **spec.task_kwargs)
    rng = random.Random(f"repair|{spec.seed}")
    tools, env = repair_tools(), demo_env_class()()
    out, fixed = [], 0
    for row in rows:
        out.append((repair_conversation(row, rng, give_up=spec.noise, decide=spec.decision_fraction,
                                        review=spec.demo_version >= 2, hint=spec.hint, env=env), tools))
        fixed += env.passed == env.total
    return out, fixed / len(out)


def demo_tokenizer(spec: Any):
    """BPE trained on 600 demonstrations as the chat template renders them (the code, the call syntax and
    the test reports get tokens of their own; digits stay one token each)."""
    from dataclasses import replace

    from grouprl.builtin.agent_demos import _render
    from grouprl.builtin.tiny import build_tokenizer

    base = build_tokenizer()
    conversations, _ = demo_examples(replace(spec, sft_rows=600))
    texts = [_render(base, messages, tools, False) for messages, tools in conversations]
    return build_tokenizer(texts, vocab_size=spec.vocab_size)


def repair_gate(spec: Any, tok: Any, n: int = 64):
    """The code-repair warm start's quality gate (``copy_gate``): ``score(model)`` = the fraction of ``n`` unseen
    training files whose demonstrated repair -- editing again after every failed run, up to ``MAX_EDITS`` -- is
    the model's argmax at every trained token but the POLICY's: the operator each edit writes in ``new`` and the
    first token of each turn after a failed run (going on rather than answering). What is checked is the SKILL
    RL needs: the calls' syntax, ``old`` copied from the view or from the previous edit, the arguments of
    ``new``, running the tests after an edit, and stopping once they pass (as
    :func:`grouprl.builtin.agent_demos.copy_gate` checks the calculator's copies)."""
    from grouprl.builtin.agent_demos import argmax_gate, conversation_ids, gate_rows

    rng = random.Random(f"gate|{spec.seed}")
    tools, env = repair_tools(), demo_env_class()()
    checked = []
    for row in gate_rows(spec, n):
        messages = repair_conversation(row, rng, give_up=0.0, env=env)
        ids, mask = conversation_ids(tok, messages, tools)
        checked.append((ids, _skill_flags(tok, messages, ids, mask)))
    return argmax_gate(tok, checked)


def _skill_flags(tok: Any, messages: list[dict], ids: list[int], mask: list[int]) -> list[int]:
    """``mask`` with 0 on the policy tokens of :func:`repair_gate`: each trained run of ``mask`` is one assistant
    turn (in order); in an edit, the tokens that overlap the operator of ``new`` (from the end of its first
    argument to the start of its second); in a turn after a failed run, the first token."""
    flags, k = list(mask), 0
    for at, turn in enumerate(messages):
        if turn["role"] != "assistant":
            continue
        while not mask[k]:
            k += 1
        end = k
        while end < len(mask) and mask[end]:
            end += 1
        before = messages[at - 1]
        if before.get("name") == "run_tests" and not _all_passed(before["content"]):
            flags[k] = 0
        if "edit(" in turn["content"]:
            text = tok.decode(ids[k:end])
            offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            if len(offsets) != end - k:
                raise ValueError("code repair gate: an edit turn does not re-tokenize to its own tokens")
            value = text.index('new="') + len('new="')
            lo = value + text[value:].index(" ")  # [lo, hi): " op" of "a op b"
            hi = text.rindex(" ", lo, value + text[value:].index('"'))
            for j, (a, b) in enumerate(offsets):
                if a < hi and b > lo:
                    flags[k + j] = 0
        k = end
    return flags


def _all_passed(report: str) -> bool:
    """Whether a ``run_tests()`` reply reports every test passed (``"3/3 tests passed."``)."""
    done, _, total = report.split(" tests passed", 1)[0].partition("/")
    return done.isdigit() and done == total


demo_gate = repair_gate
