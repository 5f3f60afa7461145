"""The retrieval reward: an LLM judge mixed with rules that the judge cannot talk its way around.

``R = 0.40 accuracy + 0.20 format + 0.20 efficiency + 0.20 safety`` (the ``retrieval`` weights of
:data:`grouprl.rewards.composite.TEMPLATES`), each dimension in [0, 1]:

- **support** (a gate, 0 or 1): the final answer cites between ``min_citations`` and ``max_citations``
  distinct passages, and *every* cited id was returned by a ``search`` call of this trajectory (read from
  the ``tool_calls`` column: the ``[p12] ...`` lines of each result, and ``env_state["returned_ids"]`` when
  given). A fabricated citation, too few, or a page of padded citations gives support 0.
- **accuracy** = answer present x support x ``(1 - judge_weight + judge_weight * judge)``: the gold answer
  (normalised) must appear in the final answer; the judge, when configured, only grades *among* supported,
  correct answers. Mixing the judge with rules is what keeps "the phrasing that pleases the judge" from
  paying: a flattering answer with no supported answer gets accuracy 0 whatever the judge says. A judge
  with no opinion (None) leaves the rule score alone.
- **format** = support x precision, where precision is the share of cited ids that are gold ids (1 when the
  row has no ``gold_ids``).
- **efficiency** = support x mean(searches within ``expected_searches``, length within ``max_tokens``),
  each falling linearly to 0 at twice its bound; nothing is efficient about an unsupported answer.
- **safety** = 0 when the answer leaks a secret (an ``api_key``, ``us_ssn`` or ``email`` hit of
  :func:`~grouprl.rewards.safety.safety_report`, or any of the ``secrets`` strings given), else 1.

The judge/rule agreement (:func:`~grouprl.rewards.judge.judge_agreement` of the judge score and the
answer-present rule) is logged as ``judge/agreement`` through TRL's ``log_metric`` when the trainer
passes it, and kept in :data:`LAST_METRICS`; the run-wide counts (:data:`RUN_TOTALS`) are printed as one
line when the process ends (:func:`judge_summary`): the agreement, how many answers the judge scored,
how many it had no opinion on, and how many the rules found correct and supported.
"""

from __future__ import annotations

import atexit
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

from grouprl.errors import RewardError
from grouprl.registry import REWARDS
from grouprl.rewards.adapters import batch_reward, completion_text
from grouprl.rewards.exact import normalize_text
from grouprl.rewards.safety import safety_report

log = logging.getLogger("grouprl.rewards.judge")

WEIGHTS = {"accuracy": 0.40, "format": 0.20, "efficiency": 0.20, "safety": 0.20}
_CITE = re.compile(r"\[(p\d+)\]")
_RESULT_ID = re.compile(r"^\s*\[(p\d+)\]", re.MULTILINE)
_BLOCKS = re.compile(r"<think>.*?</think>|<tool_call>.*?</tool_call>|<tool_response>.*?</tool_response>", re.DOTALL)
_LEAKS = frozenset({"api_key", "us_ssn", "email"})
LAST_METRICS: dict[str, float] = {}
RUN_TOTALS: dict[str, int] = dict.fromkeys(
    ("answers", "judged", "no_opinion", "agree", "supported", "rule_correct", "judge_correct"), 0)


def final_answer(text: str) -> str:
    """The answer part of a completion: after the last ``Answer:``, without think / tool blocks.

    >>> final_answer("<think>hm</think><tool_call>{}</tool_call>Answer: Seine [p21] [p20]")
    'Seine [p21] [p20]'
    """
    body = _BLOCKS.sub(" ", text)
    return body.rsplit("Answer:", 1)[1].strip() if "Answer:" in body else body.strip()


def retrieved_ids(tool_calls: Any, env_state: Any = None) -> set[str]:
    """Passage ids the search tool returned: ``[p12]`` at the start of a line of any ``search`` result."""
    ids: set[str] = set()
    for call in tool_calls or []:
        if isinstance(call, dict) and call.get("name") == "search" and not call.get("error"):
            ids.update(_RESULT_ID.findall(str(call.get("result") or "")))
    if isinstance(env_state, dict):
        ids.update(str(i) for i in env_state.get("returned_ids") or [])
    return ids


def answer_present(final: str, answer: Any) -> float:
    """1.0 when a gold answer (or any of a list) appears in ``final``, citations removed, case and spacing
    normalised (:func:`~grouprl.rewards.exact.normalize_text`).

    >>> answer_present("the seine [p20]", "Seine"), answer_present("Loire [p20]", ["Seine", "Tiber"])
    (1.0, 0.0)
    """
    answers = answer if isinstance(answer, (list, tuple)) else [answer]
    plain = normalize_text(_CITE.sub(" ", final), case_sensitive=False)
    golds = [normalize_text(str(a), case_sensitive=False) for a in answers if a is not None]
    return float(any(g and g in plain for g in golds))


def judge_question(prompt: Any) -> Any:
    """What the judge is shown of a retrieval prompt: the question after its last ``Question:``, without the
    tool protocol the policy was told (the judge grades the answer, not the protocol).

    >>> judge_question("Use the search tool ...\\n\\nQuestion: Where?")
    'Where?'
    """
    if isinstance(prompt, str) and "Question:" in prompt:
        return prompt.rsplit("Question:", 1)[1].strip()
    return prompt


def _num_searches(tool_calls: Any) -> int:
    return sum(1 for c in tool_calls or [] if isinstance(c, dict) and c.get("name") == "search")


def _within(value: float, bound: float) -> float:
    """1 up to ``bound``, then linearly down to 0 at ``2 * bound``."""
    return 1.0 if value <= bound else max(0.0, 1.0 - (value - bound) / max(bound, 1e-9))


def rule_scores(completion: str, *, answer: Any, gold_ids: Sequence[str] | None, tool_calls: Any,
                env_state: Any = None, num_tokens: int | None = None, min_citations: int = 2,
                max_citations: int = 4, expected_searches: int = 3, max_tokens: int = 512,
                secrets: Sequence[str] = ()) -> dict[str, float]:
    """The rule dimensions of one completion: ``answer``, ``support``, ``format``, ``efficiency``, ``safety``."""
    final = final_answer(completion)
    cited = list(dict.fromkeys(_CITE.findall(final)))
    shown = retrieved_ids(tool_calls, env_state)
    support = float(min_citations <= len(cited) <= max_citations and all(c in shown for c in cited))
    golds = set(gold_ids or [])
    precision = sum(c in golds for c in cited) / len(cited) if golds and cited else 1.0
    present = answer_present(final, answer)
    length = num_tokens if num_tokens is not None else len(completion.split())
    efficiency = support * 0.5 * (_within(_num_searches(tool_calls), expected_searches) + _within(length, max_tokens))
    leaked = any(h.category in _LEAKS for h in safety_report(final)) or any(s and s in completion for s in secrets)
    return {"answer": present, "support": support, "format": support * precision, "efficiency": efficiency,
            "safety": 0.0 if leaked else 1.0}


def combine(rules: dict[str, float], judge: float | None, judge_weight: float) -> float:
    """The weighted total of one completion (see the module docstring)."""
    mix = 1.0 if judge is None else (1.0 - judge_weight) + judge_weight * judge
    accuracy = rules["answer"] * rules["support"] * mix
    return (WEIGHTS["accuracy"] * accuracy + WEIGHTS["format"] * rules["format"]
            + WEIGHTS["efficiency"] * rules["efficiency"] + WEIGHTS["safety"] * rules["safety"])


def _tally(judged: Sequence[float | None], rules: Sequence[dict[str, float]]) -> None:
    """Add a batch to the run's judge/rule counts (:data:`RUN_TOTALS`); the first call arranges the summary
    line printed when the run ends."""
    if not RUN_TOTALS["answers"]:
        atexit.register(print_judge_summary)
    for j, r in zip(judged, rules):
        RUN_TOTALS["answers"] += 1
        RUN_TOTALS["supported"] += r["support"] > 0
        RUN_TOTALS["rule_correct"] += r["answer"] > 0.5
        if j is None:
            RUN_TOTALS["no_opinion"] += 1
            continue
        RUN_TOTALS["judged"] += 1
        RUN_TOTALS["judge_correct"] += j > 0.5
        RUN_TOTALS["agree"] += (j > 0.5) == (r["answer"] > 0.5)


def judge_summary(totals: dict[str, int] | None = None) -> str:
    """One line: the judge/rule agreement over the run and what it was computed on.

    >>> judge_summary({"answers": 4, "judged": 3, "no_opinion": 1, "agree": 2, "supported": 1,
    ...                "rule_correct": 2, "judge_correct": 1})
    'judge/rule agreement 0.667 over 3 judged answers (1 no opinion; rule: 2 correct, 1 supported; judge: 1 correct)'
    """
    t = totals if totals is not None else RUN_TOTALS
    agreement = f"{t['agree'] / t['judged']:.3f}" if t["judged"] else "undefined"
    return (f"judge/rule agreement {agreement} over {t['judged']} judged answers ({t['no_opinion']} no opinion; "
            f"rule: {t['rule_correct']} correct, {t['supported']} supported; judge: {t['judge_correct']} correct)")


def print_judge_summary() -> None:
    """Print :func:`judge_summary` to stderr (at exit, once the run has used a judge)."""
    if RUN_TOTALS["answers"]:
        print(f"grouprl: {judge_summary()}", file=sys.stderr, flush=True)


def _column(value: Any, n: int) -> list:
    return list(value) if isinstance(value, (list, tuple)) and len(value) == n else [value] * n


@REWARDS.register("retrieval")
@batch_reward
def retrieval_reward(prompts, completions, *, answer: Any = None, gold_ids: Any = None, tool_calls: Any = None,
                     env_state: Any = None, completion_ids: Any = None, judge: dict | None = None,
                     judge_weight: float = 0.5, min_citations: int = 2, max_citations: int = 4,
                     expected_searches: int = 3, max_tokens: int = 512, secrets: Sequence[str] = (),
                     log_metric: Any = None) -> list[float]:
    """Hybrid retrieval reward in [0, 1]: citation, answer, efficiency and safety rules, plus an optional judge.

    ``judge`` holds the ``judge`` reward's options (``base_url``, ``model``, ...; rubric ``retrieval`` by
    default); without it the rules alone score. ``tool_calls`` (one list of ``{name, arguments, result,
    error}`` per completion) is required: without the trajectory's search results no citation can be checked.

    >>> calls = [{"name": "search", "result": "[p20] France: ... Paris.\\n[p21] Paris: ... the Seine.", "error": None}]
    >>> retrieval_reward(["On which river lies the capital of France?"] * 2,
    ...                  ["Answer: Seine [p20] [p21]", "Answer: Seine [p21] [p33]"],
    ...                  answer=["Seine"] * 2, gold_ids=[["p20", "p21"]] * 2, tool_calls=[calls] * 2)
    [1.0, 0.2]

    (The second cites [p33], which no search returned: support 0, so only safety's 0.2 is left.)
    """
    n = len(completions)
    if tool_calls is None:
        raise RewardError("reward 'retrieval' needs the `tool_calls` of each trajectory to check citations; run "
                          "it with an environment (environment: search) so the trainer passes them.")
    texts = [completion_text(c) for c in completions]
    answers, golds = _column(answer, n), _column(gold_ids, n)
    calls, states, ids = _column(tool_calls, n), _column(env_state, n), _column(completion_ids, n)
    rules = [rule_scores(texts[i], answer=answers[i], gold_ids=golds[i], tool_calls=calls[i], env_state=states[i],
                         num_tokens=len(ids[i]) if ids[i] is not None else None, min_citations=min_citations,
                         max_citations=max_citations, expected_searches=expected_searches, max_tokens=max_tokens,
                         secrets=secrets) for i in range(n)]
    judged: list[float | None] = [None] * n
    if judge:
        from grouprl.rewards.judge import judge_agreement, judge_reward, prompt_text

        options = {"rubric": "retrieval", **judge}
        shown = prompts if not isinstance(prompts, (list, tuple)) else [judge_question(prompt_text(p)) for p in prompts]
        judged = judge_reward(shown, [final_answer(t) for t in texts], answer=answers, **options)
        agreement = judge_agreement(judged, [r["answer"] for r in rules])
        _tally(judged, rules)
        if agreement is not None:
            LAST_METRICS["judge/agreement"] = agreement
            log.info("judge/agreement %.3f over %d completions", agreement, n)
            if callable(log_metric):
                log_metric("judge/agreement", agreement)
    return [combine(r, j, judge_weight) for r, j in zip(rules, judged)]
