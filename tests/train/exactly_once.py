"""Did a run train every prompt of its stream exactly once? Read back from its logs and checkpoints.

A prompt's ordinal is its index in the run's prompt stream (``grouprl.data.stream``: the n-th prompt
drawn, from 0, dynamic-sampling redraws included). Each optimizer step logs the ordinals its round drew
(``data/ordinal_min`` / ``data/ordinal_max``, global over processes) and each ``samples.jsonl`` record its
prompt's ``ordinal``; a checkpoint records the training frontier (``trainer_state.json``: ordinals
``0 .. frontier - 1`` consumed). A run killed and resumed any number of times trained every prompt
exactly once when, in the logs the resume left behind:

1. the optimizer steps are 1, 2, ..., S, each logged once (a resume cuts the killed run's tail);
2. consecutive steps of one round name the same ordinals, and the rounds tile 0, 1, 2, ... with no gap
   (a prompt skipped: OpenRLHF #1322, NeMo-RL #3599) and no overlap (a prompt trained twice: TRL #5911);
3. a round lasts exactly ``steps_per_round`` steps (an unfinished round is finished after a resume, not
   redrawn, and not trained a second time from its start);
4. every logged sample of a step belongs to that step's round, every step of a round logged the same
   samples, and (when the whole round is logged on one process) each drawn prompt's G completions;
5. every checkpoint's frontier is the end of the round its step was in.

Needs ``logging_steps: 1`` and ``log_completions_steps: 1``; full coverage of 4. needs
``num_completions_to_log`` >= the completions of a round.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrainedRound:
    first: int  # ordinal of the round's first prompt
    last: int  # ordinal of its last prompt (redraws included)
    steps: list[int] = field(default_factory=list)
    ordinals: Counter = field(default_factory=Counter)  # the logged samples' ordinals (one step's worth)


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trained_rounds(run_dir: str | Path) -> list[TrainedRound]:
    """The rounds a run trained, in order, from ``metrics.jsonl`` and ``samples.jsonl``; checks 1.-4."""
    run_dir = Path(run_dir)
    records = [r for r in _jsonl(run_dir / "metrics.jsonl") if "data/ordinal_min" in r]
    steps = [r["step"] for r in records]
    assert steps == list(range(1, len(steps) + 1)), f"steps logged out of order, missing or twice: {steps}"
    samples: dict[int, Counter] = {}
    for s in _jsonl(run_dir / "samples.jsonl"):
        if "eval" not in s and "ordinal" in s:
            samples.setdefault(s["step"], Counter())[s["ordinal"]] += 1
    rounds: list[TrainedRound] = []
    for r in records:
        lo, hi = int(r["data/ordinal_min"]), int(r["data/ordinal_max"])
        logged = samples.get(r["step"], Counter())
        assert all(lo <= o <= hi for o in logged), f"step {r['step']}: samples {sorted(logged)} outside [{lo}, {hi}]"
        if rounds and (rounds[-1].first, rounds[-1].last) == (lo, hi):
            assert logged == rounds[-1].ordinals, f"step {r['step']} logged other samples than its round's first step"
            rounds[-1].steps.append(r["step"])
            continue
        expected = rounds[-1].last + 1 if rounds else 0
        assert lo == expected, (f"step {r['step']} starts at ordinal {lo}, expected {expected}: "
                                f"{'prompts skipped' if lo > expected else 'prompts trained twice'}")
        assert hi >= lo, (lo, hi)
        rounds.append(TrainedRound(lo, hi, [r["step"]], logged))
    return rounds


def assert_trained_exactly_once(run_dir: str | Path, *, steps_per_round: int, num_generations: int,
                                total_steps: int, full_rounds: bool = False,
                                shares: int = 1) -> list[TrainedRound]:
    """Checks 1.-5. for the run in ``run_dir``. ``full_rounds``: samples.jsonl logs whole rounds, so the
    logged ordinals of a round (this process's share: ``shares`` = the number of training processes, rank 0
    logs the first contiguous ``1 / shares`` of each drawn batch) are its prompts, ``num_generations`` each."""
    rounds = trained_rounds(run_dir)
    assert sum(len(r.steps) for r in rounds) == total_steps, (total_steps, [r.steps for r in rounds])
    for r in rounds:
        assert len(r.steps) == steps_per_round, f"round {r.first}..{r.last} trained on steps {r.steps}"
        if full_rounds:
            drawn = r.last - r.first + 1
            share = drawn // shares  # one batch per round (no redraws) in the runs that pass full_rounds
            mine = set(range(r.first, r.first + share))
            assert set(r.ordinals) == mine, (r.first, r.last, sorted(r.ordinals))
            assert set(r.ordinals.values()) == {num_generations}, r.ordinals
    ends = {step: r.last + 1 for r in rounds for step in r.steps}
    for ckpt in Path(run_dir).glob("checkpoint-*"):
        state = json.loads((ckpt / "trainer_state.json").read_text())
        assert state["frontier"] == ends[state["step"]], (ckpt.name, state["frontier"], ends[state["step"]])
    return rounds


def same_ordinals(a: list[TrainedRound], b: list[TrainedRound]) -> None:
    """Two runs (one uninterrupted, one killed and resumed) trained the same prompts on the same steps."""
    assert [(r.first, r.last, r.steps, r.ordinals) for r in a] == [(r.first, r.last, r.steps, r.ordinals) for r in b]
