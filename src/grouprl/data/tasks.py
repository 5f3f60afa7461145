"""Built-in tasks with verifiable answers: deterministic train / held-out splits as ``datasets.Dataset``.

Each task is a generator plus a reward recipe (the reward names a recipe should train and evaluate with):

| task          | prompt                                                    | answer  | reward recipe            |
| ------------- | --------------------------------------------------------- | ------- | ------------------------ |
| ``arithmetic``| a one- or two-step word problem ("Ana has 7 bags ...")   | ``"16"``| ``accuracy``             |
| ``countdown`` | reach a target with + - * from given numbers               | target  | ``countdown``            |
| ``calculator``| a user message "What is 4817 * 36 + 529?" (6-digit answer) | ``"173941"`` | ``accuracy``        |
| ``code_repair``| "Fix add in solution.py." + ``code`` / ``tests`` columns (:mod:`grouprl.data.code_repair`) | the repaired file | ``code_repair`` |

Demonstrations (for the bundled SFT warm start, :mod:`grouprl.builtin.warmstart`) use the format
``<think>7*3=21, 21-5=16</think>Answer: 16``: the working first, then an answer line that the
``accuracy`` reward reads (or ``Answer: 16`` alone, without the working).

Splits are disjoint by construction: every problem has a key (arithmetic: template, numbers and item;
countdown: the numbers and the target); a SHA-256 of the key puts it in ``test`` (1 in ``TEST_BUCKETS``)
or ``train``. Each split is drawn from its own seeded ``random.Random`` and keeps only problems of its own
bucket, so the same ``(task, split, seed, n)`` always gives the same rows on any machine and the two
splits never share a problem. With the default small numbers (operands up to 9, factors up to 5) there
are only 1,769 (template, numbers) combinations: 181 of the 200 default held-out problems have the
template and numbers of some problem in the default 5,000-row train split, with another item and name.
The split tests the policy (how it answers), not unseen arithmetic facts; widen ``max_value`` /
``max_factor`` for a harder held-out split.

``reasoning-gym`` (https://github.com/open-thought/reasoning-gym) works offline and has a countdown
task, but its problems (4-6 numbers up to 100, long instructions) are far beyond a CPU-sized model and it
brings ~15 packages; our own generators are small and tunable, so we use them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grouprl.errors import DataError, UnknownNameError

TEST_BUCKETS = 10  # one problem key in TEST_BUCKETS goes to the held-out split
DEFAULT_SIZES = {"train": 5000, "test": 200}
SPLIT_SEEDS = {"train": 1, "test": 2}

_NAMES = ["Ana", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jon", "Kim", "Leo", "Mia", "Noa"]
_ITEMS = ["apples", "pens", "coins", "books", "cards", "eggs", "shells", "stamps", "marbles", "cookies"]

# One-step problems: (op, template); {a} and {b} are the operands in the order the working uses them.
_TEMPLATES: list[tuple[str, str]] = [
    ("+", "{n} has {a} {i}. {n} gets {b} more {i}. How many {i} does {n} have now?"),
    ("+", "There are {a} {i} in a box and {b} {i} on the table. How many {i} are there in all?"),
    ("-", "{n} had {a} {i} and gave away {b}. How many {i} are left?"),
    ("-", "A jar holds {a} {i}. {n} takes out {b}. How many {i} stay in the jar?"),
    ("*", "{n} buys {a} bags with {b} {i} in each bag. How many {i} does {n} buy?"),
    ("*", "There are {a} rows of {i} with {b} {i} in each row. How many {i} are there?"),
]
# Two-step problems: (op1, op2, template); the working is "a op1 b = s, s op2 c = result".
_TEMPLATES2: list[tuple[str, str, str]] = [
    ("+", "-", "{n} has {a} {i}, gets {b} more and then gives away {c}. How many {i} does {n} have now?"),
    ("+", "+", "{n} has {a} {i}, finds {b} and then buys {c} more. How many {i} does {n} have now?"),
    ("-", "-", "A jar holds {a} {i}. {n} takes out {b} and later {c} more. How many {i} stay in the jar?"),
    ("*", "+", "{n} has {a} bags with {b} {i} in each bag and {c} loose {i}. How many {i} in all?"),
    ("*", "-", "{n} buys {a} bags with {b} {i} in each bag and eats {c}. How many {i} are left?"),
]


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


@dataclass(frozen=True)
class Task:
    """A built-in task: how to make one problem, and the reward recipe to train and evaluate it."""

    name: str
    make: Callable[..., dict[str, Any]]
    """``make(rng, **task_kwargs) -> row`` with at least ``prompt``, ``answer`` and ``key``."""
    reward_funcs: list[str]
    """The task's default training rewards: REWARDS names (or ``pkg.mod:fn`` plug-ins). A trainer uses
    them for ``dataset: builtin:<name>`` when the user sets no ``reward_funcs``."""
    eval_reward: str
    """The task's default held-out reward (a REWARDS name): its mean is the held-out accuracy."""
    defaults: dict[str, Any] = field(default_factory=dict)


def _bucket_is_test(key: str) -> bool:
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % TEST_BUCKETS == 0


# --------------------------------------------------------------------------- arithmetic word problems


def make_arithmetic(
    rng: random.Random, *, max_value: int = 9, max_factor: int = 5, num_steps: int = 2
) -> dict[str, Any]:
    """One word problem with ``num_steps`` (1 or 2) operations on numbers up to ``max_value``.

    Products use factors ``2..max_factor``; results are never negative. The row keeps the worked
    solution in ``work`` (e.g. ``"7*3=21, 21-5=16"``), used to write demonstrations.
    """
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    if num_steps == 1:
        t = rng.randrange(len(_TEMPLATES))
        op, template = _TEMPLATES[t]
        ops, values = [op], list(_operands(rng, op, max_value, max_factor))
    elif num_steps == 2:
        t = rng.randrange(len(_TEMPLATES2))
        op1, op2, template = _TEMPLATES2[t]
        while True:
            a, b = _operands(rng, op1, max_value, max_factor)
            c = rng.randint(1, max_value)
            if op2 != "-" or c <= _apply(op1, a, b):
                break
        ops, values = [op1, op2], [a, b, c]
    else:
        raise DataError(f"arithmetic num_steps must be 1 or 2, got {num_steps!r}")
    acc, steps = values[0], []
    for op, v in zip(ops, values[1:]):
        new = _apply(op, acc, v)
        steps.append(f"{acc}{op}{v}={new}")
        acc = new
    prompt = template.format(n=name, a=values[0], b=values[1], c=values[-1], i=item)
    return {
        "prompt": prompt + "\n",
        "answer": str(acc),
        "key": f"{num_steps}|{t}|{'|'.join(map(str, values))}|{item}",
        "work": ", ".join(steps),
    }


def _operands(rng: random.Random, op: str, max_value: int, max_factor: int) -> tuple[int, int]:
    if op == "*":
        return rng.randint(2, max_factor), rng.randint(2, max_factor)
    a, b = rng.randint(1, max_value), rng.randint(1, max_value)
    return (max(a, b), min(a, b)) if op == "-" else (a, b)


# --------------------------------------------------------------------------- countdown


def make_countdown(rng: random.Random, *, num_numbers: int = 3, max_number: int = 20) -> dict[str, Any]:
    """Numbers ``1..max_number``; the target is the value of a random expression that uses all of them.

    With the defaults (3 numbers up to 20, targets up to 100) there are about 11,900 distinct train
    and 1,280 held-out problems, enough for the default 5,000 / 200 rows (numbers up to 10 give only
    about 2,260 train problems).

    The target is kept in ``1..100`` (the generator redraws otherwise), so every problem has a solution;
    the solution in ``work`` is one of possibly several that the reward accepts.
    """
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        order = numbers[:]
        rng.shuffle(order)
        expr = str(order[0])
        for n in order[1:]:
            op = rng.choice("+-*")
            # Bracket the running expression before "*" so the left-to-right construction is what is computed.
            expr = f"({expr}){op}{n}" if op == "*" and not expr.isdigit() else f"{expr}{op}{n}"
        target = _safe_eval(expr)
        if target is not None and 1 <= target <= 100:
            break
    nums = ", ".join(str(n) for n in numbers)
    prompt = f"Use {nums} to make {target} with + - * and each number once.\n"
    return {
        "prompt": prompt,
        "answer": str(target),
        "numbers": numbers,
        "target": target,
        "key": f"{sorted(numbers)}|{target}",
        "work": expr,
    }


# The checked evaluator and the reward live in grouprl.rewards.countdown (registered as "countdown").
from grouprl.rewards.countdown import safe_eval as _safe_eval  # noqa: E402

# --------------------------------------------------------------------------- calculator

# (form, key) of the calculator task's expressions; a, b, c are drawn from the ranges of make_calculator.
_CALC_FORMS = ["{a} * {b} + {c}", "{a} * {b} - {c}", "{c} + {a} * {b}"]


def make_calculator(rng: random.Random, *, a_digits: int = 4, b_digits: int = 2, c_digits: int = 3,
                    answer_digits: int | None = 6) -> dict[str, Any]:
    """"What is 4817 * 36 + 529?": a product of an ``a_digits`` and a ``b_digits`` number plus or minus a
    ``c_digits`` number, beyond what a 0.8M-parameter model computes in its head.

    Problems are redrawn until the answer has ``answer_digits`` digits (``None``: any), so every
    prompt, tool call and tool reply of one expression form has the same number of tokens.
    The prompt is one chat message (so it is rendered by the chat template whether or not tools are on);
    the answer is the exact integer; ``work`` is the expression as written in the prompt (what a tool
    call passes to the ``calculator`` environment, :mod:`grouprl.envs.calculator`).
    """
    def draw(digits: int) -> int:
        return rng.randint(10 ** (digits - 1), 10**digits - 1)

    while True:
        form = rng.randrange(len(_CALC_FORMS))
        a, b, c = draw(a_digits), draw(b_digits), draw(c_digits)
        expression = _CALC_FORMS[form].format(a=a, b=b, c=c)
        value = a * b + c if "+" in expression else a * b - c
        if answer_digits is None or len(str(value)) == answer_digits:
            break
    return {"prompt": [{"role": "user", "content": f"What is {expression}?"}], "answer": str(value),
            "key": f"{form}|{a}|{b}|{c}", "work": expression}


# --------------------------------------------------------------------------- registry and loading

TASKS: dict[str, Task] = {
    "arithmetic": Task("arithmetic", make_arithmetic, ["accuracy"], "accuracy"),
    # accuracy would pay for repeating the target, which is in the prompt: countdown checks the expression
    "countdown": Task("countdown", make_countdown, ["countdown"], "countdown"),
    "calculator": Task("calculator", make_calculator, ["accuracy"], "accuracy"),
}


def get_task(name: str) -> Task:
    """The :class:`Task` called ``name``, or an error that lists the known ones."""
    if name not in TASKS:
        from grouprl.errors import did_you_mean

        raise UnknownNameError(
            f"unknown built-in task {name!r}. Known: {', '.join(sorted(TASKS))}.{did_you_mean(name, TASKS)}"
        )
    return TASKS[name]


def split_size(split: str, n: int | None = None, *, n_train: int | None = None, n_test: int | None = None) -> int:
    """Rows of ``split``: ``n_train`` / ``n_test`` when given; else ``n`` for train and ``min(n, 200)``
    for test (one ``dataset_kwargs: {n: 5000}`` sizes the training set without asking for 5,000
    held-out problems); else the defaults (5,000 train, 200 test).

    >>> split_size("train", 5000), split_size("test", 5000), split_size("test", 50), split_size("test", 5000, n_test=500)
    (5000, 200, 50, 500)
    """
    own = n_train if split == "train" else n_test
    if own is not None:
        return int(own)
    if n is None:
        return DEFAULT_SIZES[split]
    return int(n) if split == "train" else min(int(n), DEFAULT_SIZES[split])


def generate_rows(task: str, split: str, n: int | None = None, seed: int = 0, *, n_train: int | None = None,
                  n_test: int | None = None, **task_kwargs) -> list[dict]:
    """Distinct problems of ``task`` for ``split`` (``"train"`` or ``"test"``), deterministic in ``seed``;
    how many: :func:`split_size` of ``n``, ``n_train`` and ``n_test``.

    Rows keep the internal ``key`` and ``work`` fields (used by the SFT warm start); :func:`load_task`
    drops them.
    """
    spec = get_task(task)
    if split not in SPLIT_SEEDS:
        raise DataError(f"split must be 'train' or 'test', got {split!r}")
    n = split_size(split, n, n_train=n_train, n_test=n_test)
    if n < 1:
        raise DataError(f"n must be a positive number of rows, got {n}")
    rng = random.Random(f"{task}|{split}|{seed}|{SPLIT_SEEDS[split]}")
    want_test = split == "test"
    rows: list[dict] = []
    seen: set[str] = set()
    tries = 0
    while len(rows) < n:
        tries += 1
        if tries > 50 * n + 10000:
            raise DataError(
                f"task {task!r} with {task_kwargs} has fewer than {n} distinct {split} problems; "
                f"ask for fewer rows (n) or widen the task's ranges"
            )
        row = spec.make(rng, **{**spec.defaults, **task_kwargs})
        key = row["key"]
        if key in seen or _bucket_is_test(key) != want_test:
            continue
        seen.add(key)
        rows.append(row)
    return rows


def load_task(task: str, split: str, n: int | None = None, seed: int = 0, *, n_train: int | None = None,
              n_test: int | None = None, **task_kwargs):
    """The built-in ``task`` as a ``datasets.Dataset`` with ``prompt`` and ``answer`` columns (+ task columns).

    ``split`` is ``"train"`` (default 5,000 rows) or ``"test"`` (default 200 rows, held out); ``n``,
    ``n_train`` and ``n_test`` set the sizes (see :func:`split_size`).
    ``task_kwargs`` go to the generator (e.g. ``max_value=99`` for arithmetic, ``num_numbers=3`` for
    countdown). Same arguments, same rows, on any machine.
    """
    import datasets

    rows = generate_rows(task, split, n=n, seed=seed, n_train=n_train, n_test=n_test, **task_kwargs)
    public = [{k: v for k, v in row.items() if k not in ("key", "work")} for row in rows]
    return datasets.Dataset.from_list(public)


def demonstration(task: str, row: dict, *, wrong_answer: str | None = None, show_work: bool = True) -> str:
    """The completion a demonstrator writes for ``row``: ``<think>WORK</think>Answer: RESULT``.

    ``wrong_answer`` replaces the result (both at the end of the working and in the answer) to build
    noisy demos; ``show_work=False`` gives the answer alone, ``Answer: RESULT``. For calculator the
    working is a call ``<tool_call>calculator(expression="4817 * 36 + 529")</tool_call>`` (the tool's
    reply comes in between: see :func:`grouprl.builtin.warmstart.tool_conversation`). For countdown the
    working is the expression with its value and the answer line holds the expression
    (what :func:`countdown_reward` reads).
    """
    get_task(task)
    if task == "calculator":  # the tool call and the answer as one text; the warm start splits the turns
        call = f'<tool_call>calculator(expression="{row["work"]}")</tool_call>' if show_work else ""
        return f"{call}Answer: {row['answer'] if wrong_answer is None else wrong_answer}"
    if task == "countdown":
        expr = row["work"] if wrong_answer is None else wrong_answer
        return f"<think>{expr}={row['answer']}</think>Answer: {expr}" if show_work else f"Answer: {expr}"
    if wrong_answer is None:
        work, result = row["work"], row["answer"]
    else:  # the demonstrator slips at the last step: its working ends in the wrong result
        work, result = row["work"].rsplit("=", 1)[0] + "=" + wrong_answer, wrong_answer
    return f"<think>{work}</think>Answer: {result}" if show_work else f"Answer: {result}"


def plausible_wrong_answer(row: dict, rng: random.Random) -> str:
    """A wrong result a careless solver might write: off by one, off by ten, or two digits swapped."""
    value = int(row["answer"])
    candidates = {value + 1, value - 1, value + 10, value - 10, int(str(value)[::-1])}
    candidates = sorted(c for c in candidates if c >= 0 and c != value)
    return str(rng.choice(candidates))


def mistyped_expression(row: dict, rng: random.Random) -> tuple[str, str]:
    """A calculator row's expression with one digit mistyped, and its (wrong) value: what a careless
    tool user passes to the calculator. The leading digit of a number is never made 0.

    >>> mistyped_expression({"work": "4817 * 36 + 529"}, random.Random(0))
    ('4817 * 36 + 729', '174141')
    """
    expression = row["work"]
    while True:
        i = rng.choice([k for k, ch in enumerate(expression) if ch.isdigit()])
        digit = rng.choice([d for d in "0123456789" if d != expression[i]])
        if digit == "0" and (i == 0 or not expression[i - 1].isdigit()):
            continue
        typo = expression[:i] + digit + expression[i + 1:]
        return typo, str(_safe_eval(typo.replace(" ", "")))


def corpus(task: str, n: int = 2000) -> list[str]:
    """Texts (prompts + demonstrations) to train a tokenizer on for ``task``."""
    rows = generate_rows(task, "train", n=n, seed=12345)
    return [_prompt_text(row["prompt"]) + demonstration(task, row) for row in rows]


def _prompt_text(prompt: str | list[dict]) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt) + "\n"


# builtin:retrieval: questions over the `search` environment's corpus (rows from grouprl.data.retrieval)
from grouprl.data.retrieval import make_retrieval  # noqa: E402


def retrieval_task() -> Task:
    """The :class:`Task` for ``builtin:retrieval`` (trained and evaluated with the ``retrieval`` reward).
    There are only ``len(QUESTIONS)`` distinct problems: ask for small splits
    (``dataset_kwargs: {n_train: 20, n_test: 2}``)."""
    return Task("retrieval", make_retrieval, ["retrieval"], "retrieval")


TASKS["retrieval"] = retrieval_task()

# builtin:code_repair: a one-line function with a wrong operator, for the `python` environment (recipes/code_repair.yaml)
from grouprl.data.code_repair import make_code_repair  # noqa: E402

TASKS["code_repair"] = Task("code_repair", make_code_repair, ["code_repair"], "tests_passed")
