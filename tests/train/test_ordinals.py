"""Prompt ordinals (``grouprl.data.stream``): the n-th prompt of a run's stream, and the training frontier."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from test_round import ROWS, _ctx
from train_helpers import char_reward, train_records

from grouprl.data.stream import PromptStream
from grouprl.train.algorithms.grpo import Progress, training_frontier
from grouprl.train.algorithms.rounds import Round, generate_round
from grouprl.train.metrics import Timers
from grouprl.train.parallel.shares import RankStream


@pytest.mark.parametrize(("rows", "batch"), [(8, 2), (5, 2), (10, 3), (6, 6), (7, 4)])
def test_position_of_an_ordinal_is_where_drawing_that_many_prompts_leaves_the_stream(rows, batch):
    s = PromptStream(rows, batch, seed=1)
    assert s.drawn == 0 and s.position(0) == s.state() == {"epoch": 0, "pos": 0}
    seen = []
    for _ in range(4 * rows):
        idx = s.next()
        assert s.last_ordinals == list(range(len(seen), len(seen) + batch)) and len(idx) == batch
        seen += s.last_ordinals
        assert s.position(s.drawn) == s.state()  # the ordinal alone gives the exact position
        again = PromptStream(rows, batch, seed=1)
        again.seek(s.drawn)
        assert again.next() == PromptStream.next(_copy(s))  # and the same next batch
    # an epoch hands out (rows // batch) * batch prompts: 7 rows, batch 4 -> 4 a epoch, ordinal 8 ends epoch 1
    assert PromptStream(7, 4, 0).position(8) == {"epoch": 1, "pos": 4}
    with pytest.raises(ValueError, match="counts from 0"):
        s.position(-1)


def _copy(s: PromptStream) -> PromptStream:
    c = PromptStream(s.num_rows, s.batch, s.seed)
    c.load_state(s.state())
    return c


def test_each_rank_gets_the_global_ordinals_of_its_share():
    shared = PromptStream(16, 8, seed=0)
    r0, r1 = RankStream(shared, 0, 2), RankStream(shared, 1, 2)
    r0.next()
    assert r0.last_ordinals == [0, 1, 2, 3] and r1.last_ordinals == [4, 5, 6, 7] and r1.drawn == 8
    r1.seek(4)
    assert shared.state() == {"epoch": 0, "pos": 4} and r0.position(16) == {"epoch": 0, "pos": 16}


def test_a_round_names_the_ordinals_it_drew_redraws_included_and_each_row_its_own():
    ctx = _ctx(ROWS, dynamic_sampling="resample", max_resample_rounds=10, num_completions_to_log=8)
    stream = PromptStream(len(ROWS), 2, seed=0)
    stream.next()  # 2 prompts drawn before this round: it starts at ordinal 2
    rnd = generate_round(ctx, stream, Timers())
    drawn = 2 * (1 + int(rnd.metrics["dynamic/extra_rounds"]))
    assert (rnd.metrics["data/ordinal_min"], rnd.metrics["data/ordinal_max"]) == (2, 2 + drawn - 1)
    assert rnd.frontier == stream.drawn == 2 + drawn
    assert len(rnd.ordinals) == 8 and rnd.ordinals[:4] == [rnd.ordinals[0]] * 4  # G rows per prompt, in row order
    assert [s["ordinal"] for s in rnd.samples] == rnd.ordinals  # samples.jsonl: each completion's prompt
    # the kept prompts are the two informative ones ("vary d", "vary f"), at the ordinals they were drawn
    for s in rnd.samples:
        epoch, pos = divmod(s["ordinal"], 8)  # 8 prompts an epoch: ordinal o is prompt o % 8 of epoch o // 8
        assert ROWS[_row(epoch, pos)]["prompt"] == s["prompt"]


def _row(epoch: int, pos: int) -> int:
    s = PromptStream(len(ROWS), 2, seed=0)
    s.load_state({"epoch": epoch, "pos": pos})
    return s._order()[pos]


def test_the_frontier_is_the_end_of_the_round_taken_not_of_rounds_drawn_ahead():
    stream = PromptStream(16, 4, seed=0)
    for _ in range(3):
        stream.next()  # 12 prompts drawn: a round generated ahead (12..) is not consumed
    taken = Round([], {}, frontier=8)
    assert training_frontier(Progress(4, taken, 1, [], {}), stream) == 8
    assert training_frontier(Progress(0, None, 0, [], {}), stream) == 12  # nothing taken yet: the stream's count
    assert training_frontier(Progress(4, Round([], {}), 1, [], {}), stream) == 12  # an old checkpoint's round
    assert stream.position(8) == {"epoch": 0, "pos": 8}


def test_a_run_logs_its_ordinals_and_its_checkpoints_the_frontier(tiny_model_dir, train_rows, fast_config, tmp_path,
                                                                  capsys):
    from grouprl import GRPOTrainer

    cfg = fast_config(output_dir=str(tmp_path / "o"), max_steps=4, gradient_accumulation_steps=1, steps_per_generation=2,
                      save_strategy="steps", save_steps=1, num_completions_to_log=8)
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward).train()
    records = train_records(cfg.output_dir)
    # 2 prompts x G=4 per round, 2 optimizer steps per round
    assert [(r["data/ordinal_min"], r["data/ordinal_max"]) for r in records] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    samples = [json.loads(x) for x in (tmp_path / "o" / "samples.jsonl").read_text().splitlines()]
    assert [s["ordinal"] for s in samples if s["step"] == 3] == [2] * 4 + [3] * 4
    frontiers = {}
    for step in range(1, 5):
        state = json.loads((tmp_path / "o" / f"checkpoint-{step}" / "trainer_state.json").read_text())
        frontiers[step] = state["frontier"]
        assert state["data"] == {"epoch": 0, "pos": state["frontier"]}  # synchronous: the stream's own position
    assert frontiers == {1: 2, 2: 2, 3: 4, 4: 4}
    out = capsys.readouterr().out
    assert re.search(r"wall time: +\d+\.\d s to step 4 ", out) and "async:" not in out  # synchronous: no staleness


def test_the_summary_gives_the_staleness_of_an_async_run(tmp_path):
    from grouprl.train.trainer import async_line

    metrics = tmp_path / "metrics.jsonl"
    records = [{"step": 1, "async/staleness_run_mean": 0.0, "async/staleness_run_max": 0.0, "async/dropped": 0.0},
               {"step": 2, "async/staleness_run_mean": 0.5, "async/staleness_run_max": 1.0, "async/dropped": 2.0},
               {"step": 2, "eval/accuracy": 0.5}]
    metrics.write_text("\n".join(json.dumps(r) for r in records) + "\n{\"step\": 3, \"cut")
    result = {"metrics_path": str(metrics)}
    line = async_line(result, SimpleNamespace(max_staleness=2))
    assert line == "async:        max_staleness 2: staleness mean 0.50, max 1 steps; 2 rounds dropped"
    assert async_line(result, SimpleNamespace(max_staleness=0)) is None
