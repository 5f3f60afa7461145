"""``GRPOTrainer``: a thin facade for users who expect TRL's shape; the algorithm lives in ``loop.train``.

    trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", config=GRPOConfig(...),
                          train_dataset=ds, reward_funcs=["accuracy", my_fn])
    trainer.train()
    trainer.save_model("out/final")
"""

from __future__ import annotations

import json
import shlex
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from grouprl.config import GRPOConfig
from grouprl.data.load import check_rows, load_dataset_any
from grouprl.errors import ConfigError


class GRPOTrainer:
    """Holds the config, the model, the data and the reward functions, and calls the loop.

    ``model``: a hub id, a local path, ``builtin:<name>`` or a loaded ``PreTrainedModel`` (``None`` =
    ``config.model``). ``config`` (or TRL's ``args``): a GRPOConfig. ``train_dataset`` / ``eval_dataset``:
    a ``datasets.Dataset``, a list of dicts, or anything ``config.dataset`` accepts (``None`` = from the
    config; with an ``environment_factory`` and no dataset anywhere, the environment's ``reset()`` returns
    each rollout's prompt and ``max_steps`` sets the run's length, as in TRL). ``processing_class``: the tokenizer (``None`` = loaded with the model). ``reward_funcs``: a
    callable with TRL's signature, a registry name, or a list of them (``None`` = ``config.reward_funcs``).
    ``peft_config``: a peft ``LoraConfig`` (or set ``config.use_peft``).
    ``tools`` (functions) / ``environment_factory`` (a class): TRL's agent arguments; rollouts become
    multi-turn tool calls (docs/AGENTS.md). They merge with / replace the config's ``tools`` / ``environment``.
    """

    def __init__(self, model: Any = None, config: GRPOConfig | None = None, train_dataset: Any = None,
                 processing_class: Any = None, reward_funcs: Any = None, *, args: GRPOConfig | None = None,
                 eval_dataset: Any = None, peft_config: Any = None, eval_reward_func: Any = None,
                 tools: list | None = None, environment_factory: Any = None) -> None:
        model, self.config = _model_and_config(model, config, args)
        cfg = self.config
        from grouprl.train.algorithms import algorithm_for

        if algorithm_for(cfg).train is None:  # e.g. DPO: offline preference pairs, its own data and model loading
            raise ConfigError(f"algorithm: {cfg.algorithm} trains with its own loop, which loads its own data and "
                              f"model: run `grouprl train -c recipe.yaml`, or call "
                              f"grouprl.train.algorithms.algorithm_for(config).run(config).")
        source = self._check(cfg, model, reward_funcs)
        from grouprl.models import check_model_source, load_model, pick_device
        from grouprl.run import checks as startup
        from grouprl.train.engine.model import apply_peft
        from grouprl.train.parallel import ranks as dist

        self.device = dist.current().device(pick_device(cfg.device))  # cuda:<local_rank> under accelerate
        self._load_rewards_and_data(cfg, reward_funcs, train_dataset, eval_dataset, eval_reward_func, tools,
                                    environment_factory)
        self._used = dict(model=source, train_dataset=train_dataset if train_dataset is not None else cfg.dataset,
                          reward_funcs=self._reward_specs)
        if isinstance(source, str):
            check_model_source(source)  # a missing path / unreachable hub: seconds, not minutes of retries
        from grouprl.data.load import with_chat_template_kwargs

        self.processing_class = self.tokenizer = with_chat_template_kwargs(_tokenizer_for(source, processing_class),
                                                                           cfg.chat_template_kwargs)
        if self.agent is not None:
            self.agent.check_template(self.tokenizer)  # not prefix-preserving: say so now, with the fix
        # the model's context from its config (not its weights); a name's tokenizer was loaded from its folder
        folder = self.tokenizer.name_or_path if isinstance(source, str) and processing_class is None else source
        startup.check_prompt_lengths(cfg, self.tokenizer, startup.model_context(folder),
                                     {"train": self.train_dataset, "eval": self.eval_dataset}, agent=self.agent)
        import transformers

        transformers.set_seed(cfg.seed)
        self.model = apply_peft(load_model(source, self.device), cfg, peft_config)
        self.result: dict[str, Any] | None = None

    @staticmethod
    def _check(cfg: GRPOConfig, model: Any, reward_funcs: Any) -> Any:
        """The start-up checks before data and weights (docs/DESIGN.md, "One start-up path"); returns the
        model source."""
        from grouprl.run import checks as startup
        from grouprl.train.engine.model import apply_torch_threads
        from grouprl.train.parallel import ranks as dist

        startup.apply_task_defaults(cfg, reward_funcs)  # builtin:countdown trains on its own reward unless told
        cfg.validate()
        startup.check_config_once(cfg, reward_funcs)  # names, kwargs, sandbox level (done once per config)
        startup.check_paths(cfg)  # output_dir, dataset_kwargs, resume folder: before data and weights
        apply_torch_threads(cfg)  # before the model loads: same seed + same threads -> same run
        source = model if model is not None else cfg.model
        if source is None:
            raise ConfigError("no model: pass model=... to GRPOTrainer or set `model` in the config.")
        dist.check_config(cfg, dist.current().world)  # what N processes cannot run (the algorithm's declaration)
        return source

    def _load_rewards_and_data(self, cfg: GRPOConfig, reward_funcs: Any, train_dataset: Any, eval_dataset: Any,
                               eval_reward_func: Any, tools: Any, environment_factory: Any) -> None:
        """Reward functions, the agent (tools / environment), the train and eval splits: before the model."""
        from grouprl.run import checks as startup
        from grouprl.run.reward_signal import warn_missing_reward_columns
        from grouprl.train.agent import build_agent, default_reward_funcs
        from grouprl.train.score import resolve_reward_funcs

        self.agent = build_agent(cfg, tools, environment_factory)  # names imported, schemas built: before the model
        reward_funcs = default_reward_funcs(cfg, reward_funcs, self.agent)  # [] when the environment owns it
        self._reward_specs = reward_funcs if reward_funcs is not None else cfg.reward_funcs
        self.reward_funcs = resolve_reward_funcs(self._reward_specs, cfg.reward_kwargs,
                                                 allow_empty=self.agent is not None)
        if cfg.reward_weights is not None and len(cfg.reward_weights) != len(self.reward_funcs):
            raise ConfigError(f"reward_weights has {len(cfg.reward_weights)} entries but {len(self.reward_funcs)} "
                              f"reward functions were given: one weight per function.")
        self.train_dataset = self._load_split(train_dataset, cfg.train_split, cfg.max_train_samples, required=True)
        self.eval_dataset = self._load_split(eval_dataset, cfg.eval_split, cfg.max_eval_samples, required=False)
        warn_missing_reward_columns(self._reward_specs, self.train_dataset)  # no `answer` for accuracy: said now
        self.eval_reward_func = eval_reward_func
        note = startup.eval_split_note(cfg, eval_dataset is not None, self.eval_dataset)
        if note:
            print(note)
        if self.eval_dataset is not None and eval_reward_func is None:
            self.eval_reward_func = resolve_reward_funcs([cfg.eval_reward], cfg.reward_kwargs)[0]

    def _load_split(self, given: Any, split: str | None, limit: int | None, *, required: bool):
        cfg = self.config
        if given is not None:
            from grouprl.run.checks import dataset_object

            ds = load_dataset_any(dataset_object(given), split or "train", **cfg.dataset_kwargs)
        elif cfg.dataset is not None and split is not None:
            ds = load_dataset_any(cfg.dataset, split, **cfg.dataset_kwargs)
        else:
            ds = None
        if ds is None and required and self.agent is not None and self.agent.owns_prompt:
            from grouprl.train.agent import placeholder_dataset

            ds = placeholder_dataset(cfg)  # TRL: reset() returns each rollout's prompt; max_steps sets the length
        if ds is None:
            if required:
                raise ConfigError(f"no training data: pass train_dataset=... or set `dataset` in the config "
                                  f"(split {split!r} was not found).")
            return None
        if limit is not None:
            ds = ds.select(range(min(limit, len(ds))))
        if self.agent is not None and self.agent.env_classes:
            from grouprl.train.agent import fill_prompts

            ds = fill_prompts(ds, cfg.prompt_column)  # TRL: reset() may supply the prompt
        check_rows(ds, cfg.prompt_column)
        return ds

    def train(self, resume_from_checkpoint: Any = None) -> dict[str, Any]:
        """Run the loop; print a summary; the final model goes to ``<output_dir>/final``.

        A fresh run (no ``resume_from_checkpoint`` here or in the config) into an output_dir holding an
        earlier run's checkpoints or final model raises ConfigError unless ``overwrite_output_dir`` is true,
        which deletes that run's checkpoints, final model and logs first (``grouprl.run.output_dir``).
        The run holds ``<output_dir>/.lock`` throughout (``grouprl.run.lock``); SIGINT / SIGTERM save a
        checkpoint and raise ``grouprl.run.signals.RunInterrupted``; a resume may change only the fields
        of ``grouprl.run.resume_config.SAFE``."""
        from grouprl.config.io import write_yaml
        from grouprl.run import reporting
        from grouprl.run.checks import check_resume_model, recorded_config
        from grouprl.run.lock import run_lock
        from grouprl.run.output_dir import resume_checkpoint, start_run
        from grouprl.train.algorithms import algorithm_for
        from grouprl.train.checkpoint import save_final_atomic
        from grouprl.train.parallel import ranks as dist

        cfg, ranks = self.config, dist.current()  # ranks: rank 0 alone touches the run's files (train/parallel/ranks.py)

        def prepare() -> Any:  # rank 0: resume or fresh, config checks, config.yaml, run_meta.json
            resume = start_run(cfg, resume_from_checkpoint)
            check_resume_model(self.model.config.to_dict(), resume_checkpoint(cfg, resume))  # before its weights
            # config.yaml names what was used: a model object's path, '<python object: N rows>', reward import paths
            write_yaml(recorded_config(cfg, **self._used), Path(cfg.output_dir) / "config.yaml")
            reporting.write_meta(cfg, self._reward_specs)  # which rewards, in which version (run_meta.json)
            return resume

        with run_lock(cfg.output_dir) if ranks.is_main else nullcontext():  # one run per output_dir
            resume = ranks.on_main(prepare)
            started = time.perf_counter()
            self.result = algorithm_for(cfg).train(cfg, self.model, self.tokenizer, self.train_dataset, self.eval_dataset,
                                self.reward_funcs, self.eval_reward_func, resume=resume, agent=self.agent)
            full = ranks.sharding.full_state_dict(self.model)  # FSDP: the full weights gathered on rank 0; else None
            final = ranks.on_main(save_final_atomic, self.model, self.tokenizer, cfg.output_dir,
                                  self.result["global_step"], **({} if full is None else {"state_dict": full}))
        self.result["final_model"] = str(final)
        self.result["wall_s"] = time.perf_counter() - started  # the loop and the final save, not the model load
        if not ranks.is_main:
            return self.result
        self.result["report"] = str(reporting.refresh(cfg.output_dir, cfg.review_window) or "")
        print_summary(self.result, cfg)
        return self.result

    def save_model(self, path: str | Path) -> Path:
        """``save_pretrained`` the model (an adapter for LoRA runs) and the tokenizer into ``path``."""
        from grouprl.train.engine.model import save_final

        return save_final(self.model, self.tokenizer, path)

    def evaluate(self, **overrides: Any) -> dict[str, Any]:
        """Held-out accuracy of the current model, as the in-training evaluation computes it (the recipe's
        eval settings; ``temperature``, ``num_samples``, ``ks`` override them)."""
        from grouprl.train.evaluate import evaluate_model

        if self.eval_dataset is None:
            raise ConfigError("no eval split: set eval_split and dataset, or pass eval_dataset=.")
        rows = [self.eval_dataset[i] for i in range(len(self.eval_dataset))]
        return evaluate_model(self.config, self.model, self.tokenizer, rows, self.eval_reward_func, agent=self.agent,
                              **overrides)


def _model_and_config(model: Any, config: Any, args: Any) -> tuple[Any, GRPOConfig]:
    """``(model, config)`` from the constructor's arguments; ``GRPOTrainer(GRPOConfig(...))`` -- the config
    given first, as TRL users write ``GRPOTrainer(args)`` -- is taken as the config."""
    if isinstance(model, GRPOConfig):
        if config is not None or args is not None:
            raise ConfigError("GRPOTrainer(GRPOConfig(...), ...): the first argument is the model. Fix: "
                              "GRPOTrainer(config=GRPOConfig(...), train_dataset=...), keywords after it.")
        model, config = None, model
    if config is not None and args is not None and config is not args:
        raise ConfigError("pass the configuration once: config=... or TRL's args=..., not both.")
    cfg = config or args or GRPOConfig()
    if not isinstance(cfg, GRPOConfig):
        raise ConfigError(f"config must be a grouprl GRPOConfig, got {type(cfg).__name__}. Build it with "
                          f"`from grouprl import GRPOConfig`.")
    return model, cfg


def _tokenizer_for(source: Any, processing_class: Any):
    """The given tokenizer, or the one saved with the model (hub id, path, builtin name or loaded model)."""
    from grouprl.models import load_tokenizer, resolve_model_path

    if processing_class is not None:
        return load_tokenizer(None, processing_class)
    if isinstance(source, str):
        return load_tokenizer(resolve_model_path(source))
    path = getattr(getattr(source, "config", None), "_name_or_path", None)
    if not path:
        raise ConfigError("a loaded model was given without processing_class=tokenizer: pass the tokenizer.")
    return load_tokenizer(path)


def print_summary(result: dict[str, Any], cfg: GRPOConfig) -> None:
    """Held-out accuracy before/after, the reward curve, where the logs are, how to rerun evaluation."""
    from rich.console import Console

    from grouprl.train.metrics import summarize_rewards

    console = Console()
    evals = result.get("evals", {})
    lines = [f"[bold]grouprl: trained {result['global_step']} steps[/bold]"]
    before, after = evals.get("before", {}), evals.get("after", {})
    if before or after:
        fmt = lambda e: f"{e['accuracy']:.3f}" if e and e.get("accuracy") == e.get("accuracy") else "-"  # noqa: E731
        lines.append(f"held-out accuracy: before {fmt(before)}  ->  after {fmt(after)}"
                     f"  ({after.get('num_prompts', before.get('num_prompts', 0))} prompts, "
                     f"{'greedy' if cfg.eval_temperature == 0 else f'T={cfg.eval_temperature}'})")
    tools = tool_use_line(before, after)
    if tools:
        lines.append(tools)
    curve = summarize_rewards(result.get("history", []))
    if curve:
        lines.append(f"train reward: first {curve['first']:.3f}, last {curve['last']:.3f}, max {curve['max']:.3f}; "
                     f"mean of first fifth {curve['first_fifth_mean']:.3f} -> last fifth {curve['last_fifth_mean']:.3f}")
    if isinstance(result.get("wall_s"), float):
        lines.append(f"wall time:    {result['wall_s']:.1f} s to step {result['global_step']} (this process: generation, "
                     f"updates, evaluations, checkpoints; model loading excluded)")
    staleness = async_line(result, cfg)
    if staleness:
        lines.append(staleness)
    lines.append(f"final model:  {result.get('final_model')}")
    if result.get("last_checkpoint"):
        lines.append(f"checkpoint:   {result['last_checkpoint']}")
    lines.append(f"metrics:      {result['metrics_path']}")
    lines.append(f"samples:      {result['samples_path']}")
    if result.get("report"):
        lines.append(f"report:       {result['report']}  (open it in a browser)")
    if result.get("tensorboard_dir"):
        lines.append(f"tensorboard:  tensorboard --logdir {result['tensorboard_dir']}")
    recipe = shlex.quote(str(Path(cfg.output_dir) / "config.yaml"))  # the resolved recipe, overrides included
    command = f"grouprl eval -c {recipe} --checkpoint {shlex.quote(str(result.get('final_model')))}"
    in_main = [n for n in [*cfg.tools, cfg.environment or ""] if str(n).startswith("__main__:")]
    if in_main:  # a script's own functions: another process cannot import them by that name
        lines.append(f"re-evaluate:  {', '.join(map(str, in_main))} live in the script that ran (__main__); move "
                     f"them into a module (e.g. my_tools.py), use my_tools:NAME in {recipe}, then: "
                     f"PYTHONPATH=. {command}")
    elif cfg.dataset is None or cfg.eval_split is None:  # data given in Python: the recipe cannot name it
        lines.append(f"re-evaluate:  set `dataset` and `eval_split` in {recipe}, then: {command}")
    elif not evals:  # e.g. a single file: no held-out split, so a command would fail
        lines.append(f"re-evaluate:  {cfg.dataset} has no {cfg.eval_split!r} split, so this run has no held-out "
                     f"evaluation to repeat")
    else:
        lines.append(f"re-evaluate:  {command}")
    console.print("\n".join(lines), highlight=False, soft_wrap=True)


def async_line(result: dict, cfg: GRPOConfig) -> str | None:
    """With ``max_staleness`` >= 1: the staleness of the rounds trained and the rounds dropped, from the last
    step's running ``async/*`` figures in metrics.jsonl."""
    if not getattr(cfg, "max_staleness", 0) or not result.get("metrics_path"):
        return None
    path, last = Path(result["metrics_path"]), None
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "async/staleness_run_mean" in record:
                last = record
    if last is None:
        return None
    return (f"async:        max_staleness {cfg.max_staleness}: staleness mean {last['async/staleness_run_mean']:.2f}, "
            f"max {last['async/staleness_run_max']:.0f} steps; {last.get('async/dropped') or 0:.0f} rounds dropped")


def tool_use_line(before: dict, after: dict) -> str | None:
    """For an agent run: held-out tool use before -> after (calls and failures per trajectory, turns, and the
    environment's counters per trajectory, e.g. the python environment's ``edits`` and ``iterations``)."""
    keys = (("tools/calls_per_traj", "tool calls per trajectory"), ("tools/failure_frac", "failed calls"),
            ("turns/mean", "turns"))
    keys += tuple((k, k.split("/", 1)[1]) for k in sorted({*before, *after}) if k.startswith("env/"))

    def fmt(evals: dict, key: str) -> str:
        return f"{evals[key]:.2f}" if isinstance(evals.get(key), (int, float)) else "-"

    parts = [f"{label} {fmt(before, key)} -> {fmt(after, key)}" for key, label in keys
             if key in after or key in before]
    return ("held-out tool use: " + ", ".join(parts)) if parts else None

