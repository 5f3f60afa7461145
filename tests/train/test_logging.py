"""Log files after a kill and resume, and the live progress bar's neighbours (no model needed)."""

from __future__ import annotations

import json

from grouprl.train.metrics import MetricsLogger


def _logger(out, **kw):
    return MetricsLogger(out, ["tensorboard"], run_name=None, total_steps=6, progress=False, **kw)


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_resume_drops_the_killed_runs_records_after_the_checkpoint(tmp_path):
    first = _logger(tmp_path)
    for step in range(1, 6):  # the killed run logged steps 1..5 ...
        first.log(step, {"reward": float(step)})
        first.log_samples(step, [{"completion": f"c{step}"}])
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:  # ... and was killed in the middle of writing a record
        f.write('{"step": 6, "rew')
    resumed = _logger(tmp_path, resume=True, resume_step=3)  # its newest checkpoint was step 3
    resumed.log(4, {"reward": 40.0})
    resumed.log_samples(4, [{"completion": "again"}])
    resumed.close()
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["reward"] == 40.0
    assert _steps(tmp_path / "samples.jsonl") == [1, 2, 3, 4]
    # TensorBoard: the resumed writer purges the killed run's events after step 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/reward")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_transformers_bars_are_paused_while_the_live_bar_runs(tmp_path):
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    logger = MetricsLogger(tmp_path, [], run_name=None, total_steps=2, progress=True)
    assert not hf_logging.is_progress_bar_enabled()  # no "Writing model shards" bar under ours at checkpoints
    logger.advance(1, {"reward": 0.5, "kl": 0.01, "policy/clip_frac": 0.125})
    logger.close()
    assert hf_logging.is_progress_bar_enabled()


def test_without_a_terminal_each_logged_step_is_one_plain_line(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, [], run_name=None, total_steps=4, progress=True)  # capsys: not a tty
    for step in (1, 2):
        metrics = {"reward": 0.25 * step, "kl": float("nan"), "policy/clip_frac": 0.5}
        if step == 2:  # logging_steps=2: only step 2 is logged
            logger.log(step, metrics)
        logger.advance(step, metrics)
    logger.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("grouprl step")]
    assert lines == ["grouprl step 2/4  reward 0.500  kl -  clip 0.500"]
