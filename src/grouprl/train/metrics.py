"""Where numbers go: metrics.jsonl (always), TensorBoard / W&B (``report_to``), a rich progress bar,
samples.jsonl every N steps, and the timers that split a step into its phases.

What the logged numbers mean (one record per optimizer step):

- ``reward``, ``reward_std`` (mean within-group std), ``frac_reward_zero_std``, ``rewards/<fn>/mean|std|frac_none``,
  ``reward/frac_unknown`` (completions without a total reward: trained with no loss): the round's first
  sampled batch, before dynamic sampling.
- ``advantage/*``, ``completions/*`` (lengths in tokens, ``truncated_frac`` = no EOS within max_new_tokens;
  ``mean|min|max_terminated_length`` over the completions that ended with EOS, 0 when none did, as TRL).
- ``loss/policy``: the aggregated clipped surrogate of the whole optimizer step, exactly (micro-batch
  losses are normalised by the step's totals, so their sum is the step's loss). On-policy the ratio is 1 and
  the value is the advantage-weighted token average -- near 0 because advantages are centred per group: a
  property of the objective, not a logging artefact. ``loss/kl`` (aggregated KL), ``loss/total``.
- ``kl``: token-mean KL(pi_theta || pi_ref) estimate (left out when kl_coef = 0: there is no reference);
  ``entropy``: token-mean entropy of the sampling distribution; ``policy/*``: ratio min/mean/max, clip
  fractions (low, high, region) and approx_kl to the rollout policy.
- ``grad_norm`` (before clipping; null on a skipped step), ``lr``, ``num_tokens`` (loss tokens),
  ``tokens_per_s``; ``skipped_steps``: optimizer steps skipped so far because their loss or gradient norm
  was not finite (no update was applied; ``max_consecutive_skips`` in a row stop the run).
- ``dynamic/kept_groups``, ``dynamic/extra_rounds``, ``dynamic/frac_zero_std_kept``: dynamic sampling
  (DAPO, arXiv:2503.14476, Sec. 3.2).
- ``data/ordinal_min``, ``data/ordinal_max``: the prompt ordinals (``data/stream.py``: the n-th prompt of the
  run's stream, from 0, over every process) the round of this step drew, dynamic-sampling redraws included;
  the rounds of a run tile 0, 1, 2, ... without a gap or an overlap (resumes included). Each samples.jsonl
  record carries its prompt's ``ordinal``.
- agent runs (tools or an environment, docs/AGENTS.md): ``tools/calls_per_traj``, ``tools/failure_frac``
  (failed / all calls), ``turns/mean``, ``end_reason/<reason>`` fractions, ``tokens/model`` / ``tokens/tool``
  per rollout, ``rewards/<EnvClass>/mean|std`` (the environment's ``get_reward``, named after its class as
  TRL names it); ``completions/*_length`` count model tokens only.
- ``time/*``: generate, reward, ref_forward, old_logp_forward, policy_fwd_bwd, optimizer, other; coarse
  ``time/score`` (reward + ref + old log-probs) and ``time/update`` (fwd/bwd + optimizer); ``time/step``.

TensorBoard and W&B also get TRL's names (:data:`TRL_NAMES`, next to ours, which say more), so a dashboard
built for TRL runs reads a grouprl run: ``learning_rate``, ``loss``, ``policy_loss``, ``clip_ratio/low_mean``
/ ``high_mean`` / ``region_mean``, ``completions/clipped_ratio``, ``step_time``, ``tools/call_frequency``,
``tools/failure_frequency``; every key goes under ``train/`` (``eval/*`` keys stay as they are), as
transformers' ``Trainer`` writes them. metrics.jsonl keeps grouprl's names only (one name per number). A
value that is not finite (NaN, inf) is left out of TensorBoard and W&B rather than drawn as a gap. Not
written: TRL's ``clip_ratio/low_min`` / ``high_max`` (minimum / maximum over processes; grouprl logs the
global mean).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# fine phase -> coarse phase (the generate / score / update split)
PHASES = {"generate": "generate", "reward": "score", "ref_forward": "score", "old_logp_forward": "score",
          "policy_fwd_bwd": "update", "optimizer": "update", "other": "other"}


class Timers:
    """Accumulates wall time per phase: ``with timers("generate"): ...``; ``pop()`` returns and resets."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.started = time.perf_counter()

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] += time.perf_counter() - t0

    def restart(self) -> None:
        """Start the wall clock of the next step now (time since the last pop is not counted)."""
        self.started = time.perf_counter()

    def pop(self) -> dict[str, float]:
        now = time.perf_counter()
        wall = now - self.started
        measured = sum(self.totals.values())
        out = {f"time/{k}": self.totals.get(k, 0.0) for k in PHASES if k != "other"}
        out["time/other"] = max(0.0, wall - measured)
        for coarse in ("score", "update"):  # time/generate is both a fine and a coarse phase
            out[f"time/{coarse}"] = sum(self.totals.get(k, 0.0) for k, c in PHASES.items() if c == coarse)
        out["time/step"] = wall
        self.totals.clear()
        self.started = now
        return out


# ours -> TRL's (GRPOTrainer 1.16 ``_metrics`` keys; transformers' ``learning_rate`` and ``loss``)
TRL_NAMES = {
    "lr": "learning_rate",
    "loss/total": "loss",
    "loss/policy": "policy_loss",
    "policy/clip_frac_low": "clip_ratio/low_mean",
    "policy/clip_frac_high": "clip_ratio/high_mean",
    "policy/clip_frac": "clip_ratio/region_mean",
    "completions/truncated_frac": "completions/clipped_ratio",
    "time/step": "step_time",
    "tools/calls_per_traj": "tools/call_frequency",
    "tools/failure_frac": "tools/failure_frequency",
}


def with_trl_names(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` plus TRL's name for each key that has one (:data:`TRL_NAMES`), without the metrics that do
    not apply to this run: ``kl`` when there is no reference model (kl_coef = 0, NaN), as TRL omits it.

    >>> with_trl_names({"lr": 1e-3, "kl": float("nan"), "time/step": 2.0})
    {'lr': 0.001, 'time/step': 2.0, 'learning_rate': 0.001, 'step_time': 2.0}
    """
    out = {k: v for k, v in metrics.items() if not (k == "kl" and isinstance(v, float) and math.isnan(v))}
    for ours, theirs in TRL_NAMES.items():
        if ours in out and theirs not in out:
            out[theirs] = out[ours]
    return out


def board_tag(key: str) -> str:
    """The TensorBoard / W&B tag of a metric: ``train/<key>``, as transformers writes; ``eval/*`` unchanged."""
    return key if key.startswith(("eval/", "train/")) else f"train/{key}"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


class MetricsLogger:
    """Fan-out of one metrics dict per logged step to every configured sink."""

    def __init__(self, output_dir: str | Path, targets: list[str], *, run_name: str | None, total_steps: int,
                 progress: bool, config: dict[str, Any] | None = None, resume: bool = False,
                 resume_step: int | None = None) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        self.tb_dir: Path | None = None
        mode = "a" if resume else "w"
        if resume and resume_step is not None:  # a killed run logged steps after its checkpoint: redone now
            for path in (self.metrics_path, self.samples_path):
                _drop_records_after(path, resume_step)
        self._metrics = self.metrics_path.open(mode)
        self._samples = self.samples_path.open(mode)
        self._tb = self._wandb = None
        if "tensorboard" in targets:
            from torch.utils.tensorboard import SummaryWriter

            self.tb_dir = self.dir / "tensorboard"
            purge = resume_step + 1 if resume and resume_step is not None else None  # hide the killed run's tail
            self._tb = SummaryWriter(log_dir=str(self.tb_dir), purge_step=purge)
        if "wandb" in targets:
            try:
                import wandb  # optional dependency: only imported when asked for
            except ImportError as e:
                from grouprl.errors import ConfigError

                raise ConfigError("report_to includes 'wandb' but wandb is not installed. Fix: "
                                  "pip install 'grouprl[wandb]', or drop wandb from report_to.") from e

            self._wandb = wandb.init(name=run_name or self.dir.name, config=config or {}, resume="allow")
        self._progress = self._task = None
        self._bars_paused = False
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("[bold]grouprl"), BarColumn(), MofNCompleteColumn(),
                                      TimeRemainingColumn(), TextColumn("{task.fields[live]}"), transient=False)
            self._task = self._progress.add_task("train", total=total_steps, live="")
            self._progress.start()
            self._bars_paused = _pause_transformers_bars()
        # not a terminal (a batch job's log file, a pipe): no live bar, so one plain line per logged step
        self._plain = self._progress is not None and not self._progress.console.is_terminal
        self._total, self._logged_step = total_steps, -1

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._logged_step = step
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        numeric = {board_tag(k): v for k, v in with_trl_names(metrics).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def advance(self, step: int, metrics: dict[str, Any]) -> None:
        if self._progress is None:
            return
        def fmt(key: str, digits: int) -> str:
            value = metrics.get(key)
            return f"{value:.{digits}f}" if isinstance(value, float) and math.isfinite(value) else "-"

        live = f"reward {fmt('reward', 3)}  kl {fmt('kl', 4)}  clip {fmt('policy/clip_frac', 3)}"
        self._progress.update(self._task, completed=step, live=live)
        if self._plain and step == self._logged_step:
            self._progress.console.print(f"grouprl step {step}/{self._total}  {live}", highlight=False)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._samples.write(json.dumps({"step": step, **row}, default=str) + "\n")
        self._samples.flush()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._bars_paused:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_progress_bar()
        self._metrics.close()
        self._samples.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _pause_transformers_bars() -> bool:
    """Silence transformers' tqdm bars (a "Writing model shards" bar at every checkpoint would scroll the live
    bar away) until close(); True when they were on."""
    from transformers.utils import logging as hf_logging

    if not hf_logging.is_progress_bar_enabled():
        return False
    hf_logging.disable_progress_bar()
    return True


def _drop_records_after(path: Path, step: int) -> None:
    """Keep the JSONL records of steps <= ``step`` (and drop a line cut short by a kill); atomic rewrite."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def summarize_rewards(history: list[dict[str, Any]], key: str = "reward") -> dict[str, float]:
    """First / last / best / mean of a logged series, for the end-of-run summary."""
    values = [h[key] for h in history if isinstance(h.get(key), (int, float)) and not math.isnan(h[key])]
    if not values:
        return {}
    k = max(1, len(values) // 5)
    return {"first": values[0], "last": values[-1], "max": max(values), "mean": sum(values) / len(values),
            "first_fifth_mean": sum(values[:k]) / k, "last_fifth_mean": sum(values[-k:]) / k}


# ---- one generation round ---------------------------------------------------------------------------
def nan_stats(values: Any) -> tuple[float, float]:
    """Mean and population std of the non-NaN entries (NaN, NaN when there are none)."""
    import torch

    v = values[~torch.isnan(values)]
    if v.numel() == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(unbiased=False))


def round_metrics(names: list[str], rewards: Any, components: list[list[float]], rollout: Any, adv: Any,
                  zero_std: Any) -> dict[str, float]:
    """Reward (total and per function), group spread, advantage and length statistics of a round.

    ``rewards [B,G]`` / ``components [N][F]`` / ``rollout`` are the first sampled batch (before dynamic
    sampling), ``adv [N]`` the advantages trained on, ``zero_std [B]`` the groups whose rewards all agree.
    """
    import torch

    m: dict[str, float] = {}
    m["reward"], m["reward/std_all"] = nan_stats(rewards.flatten())
    valid = ~torch.isnan(rewards)
    m["reward/frac_unknown"] = float((~valid).float().mean())  # no total (missing_reward='exclude')
    group_std = [float(r[v].std(unbiased=False)) if int(v.sum()) > 1 else 0.0 for r, v in zip(rewards, valid)]
    m["reward_std"] = sum(group_std) / len(group_std)
    m["frac_reward_zero_std"] = float(zero_std.float().mean())
    comps = torch.tensor(components, dtype=torch.float32)
    for j, name in enumerate(names):
        m[f"rewards/{name}/mean"], m[f"rewards/{name}/std"] = nan_stats(comps[:, j])
        m[f"rewards/{name}/frac_none"] = float(torch.isnan(comps[:, j]).float().mean())
    m.update({"advantage/mean": float(adv.mean()), "advantage/std": float(adv.std(unbiased=False)),
              "advantage/min": float(adv.min()), "advantage/max": float(adv.max()),
              "advantage/frac_zero": float((adv == 0).float().mean())})
    # model tokens only: tool outputs in a multi-turn completion (loss_mask 0) are not the policy's length
    lengths = (rollout.completion_mask if getattr(rollout, "loss_mask", None) is None else rollout.loss_mask).sum(dim=1).float()
    m.update({"completions/mean_length": float(lengths.mean()), "completions/min_length": float(lengths.min()),
              "completions/max_length": float(lengths.max()),
              "completions/truncated_frac": float(rollout.truncated.float().mean())})
    ended = lengths[~rollout.truncated.bool().to(lengths.device)]
    ended = ended if ended.numel() else torch.zeros(1)  # TRL: 0 when no completion ended with EOS
    m.update({"completions/mean_terminated_length": float(ended.mean()),
              "completions/min_terminated_length": float(ended.min()),
              "completions/max_terminated_length": float(ended.max())})
    return m


def round_samples(names: list[str], rollout: Any, rewards: Any, components: list[list[float]], adv: Any,
                  n: int, tokenizer: Any = None) -> list[dict]:
    """The first ``n`` completions of a round for samples.jsonl (None where a reward had no opinion).

    Agent runs (``rollout.trajectories``) add the whole trajectory: ``messages``, ``tool_calls`` (with their
    results and errors), ``num_turns``, ``end_reason``, ``env_reward``, ``env_state``, ``completion_ids``,
    ``tokens`` (the text of each completion token) and ``loss_mask`` (0 = tool output, not trained on)."""
    from grouprl.train.agent import trajectory_record

    totals = rewards.reshape(-1)
    trajs = getattr(rollout, "trajectories", None)
    out = []
    for i in range(min(n, len(rollout))):
        comps = {name: _none_if_nan(components[i][j]) for j, name in enumerate(names)}
        row = {"prompt": rollout.prompts[i], "completion": rollout.completions[i],
               "reward": _none_if_nan(float(totals[i])), "rewards": comps, "advantage": float(adv[i]),
               "truncated": bool(rollout.truncated[i])}
        if trajs is not None:
            row.update(trajectory_record(trajs[i], tokenizer))
        out.append(row)
    return out


def _none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else x


def report_step(cfg: Any, logger: MetricsLogger, step: int, total_steps: int, metrics: dict[str, Any],
                samples: list[dict], history: list[dict]) -> None:
    """Log one optimizer step: metrics.jsonl / TensorBoard / W&B, progress bar, samples.jsonl."""
    # prompt + completion tokens this step trained on, per second of the whole step (generation included)
    metrics["tokens_per_s"] = metrics.pop("seq_tokens") / max(metrics["time/step"], 1e-9)
    if isinstance(metrics.get("kl"), float) and math.isnan(metrics["kl"]):
        del metrics["kl"]  # no reference model (kl_coef = 0): the metric does not apply, as TRL leaves it out
    if step % cfg.logging_steps == 0 or step == total_steps:
        logger.log(step, metrics)
        history.append({"step": step, **{k: metrics.get(k) for k in ("reward", "loss/policy", "kl", "entropy")}})
    logger.advance(step, metrics)
    if cfg.log_completions_steps and step % cfg.log_completions_steps == 0:
        logger.log_samples(step, samples)
