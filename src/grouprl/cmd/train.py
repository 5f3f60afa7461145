"""``grouprl train -c recipe.yaml key=value ... [--resume]``: run GRPO / GSPO from a YAML recipe."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model from a YAML recipe (GRPO, GSPO, DAPO, PPO, DPO, tool-using agents)",
                       description="Train with a YAML recipe; `key=value` overrides any field (dotted keys nest, "
                                   "e.g. reward_kwargs.accuracy.task_type=math).")
    p.add_argument("-c", "--config", help="YAML recipe (fields of GRPOConfig)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override a config field")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                   help="resume from the latest checkpoint in output_dir (or from CHECKPOINT)")
    p.add_argument("--help-config", action="store_true", help="list every config field with its documentation")
    p.add_argument("--dry-run", action="store_true", help="validate the recipe and print it; load nothing")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train on N processes: runs `accelerate launch --num_processes N -m grouprl train ...` "
                        "(docs/DISTRIBUTED.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from grouprl.config import GRPOConfig
    from grouprl.run.checks import check_config_once

    if args.help_config:
        defaults = GRPOConfig.field_defaults()
        for name, doc in GRPOConfig.field_docs().items():
            print(f"{name} (default: {defaults[name]}):\n    {doc}")
        return 0
    cfg = GRPOConfig.from_yaml(args.config, args.overrides)
    check_config_once(cfg)  # names, kwargs, sandbox level: the trainer does not repeat them
    from grouprl.run.lock import check_free, run_lock
    from grouprl.run.output_dir import check_run_folder
    from grouprl.train.algorithms import algorithm_for

    algorithm = algorithm_for(cfg)  # the registered loop the config's algorithm declares (ALGORITHMS)
    if args.nproc is not None and not args.dry_run:
        from grouprl.cmd.launch import launch

        return launch(args, cfg)
    if args.dry_run:
        check_free(cfg.output_dir)  # another run holds output_dir
        resume, _ = check_run_folder(cfg, args.resume)  # resume or fresh, earlier run's files, config changes
        import yaml

        from grouprl.run.checks import dry_run

        for note in (algorithm.dry_run or dry_run)(cfg, resume):  # the checks a run makes before loading weights
            print(note, file=sys.stderr)
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return 0
    from contextlib import nullcontext

    from grouprl.run.signals import RunInterrupted
    from grouprl.train.parallel import ranks as dist

    ranks = dist.current()  # under accelerate launch: rank 0 holds the lock and decides resume / fresh
    try:
        if algorithm.run is not None:  # a loop that loads its own data and model (DPO), N ranks too
            dist.check_config(cfg, ranks.world)  # what N processes cannot run, before any model loads
            algorithm.run(cfg, resume=args.resume)
            return 0
        from grouprl.train import GRPOTrainer

        with run_lock(cfg.output_dir) if ranks.is_main else nullcontext():  # from before the model loads to the end
            resume, _ = ranks.on_main(check_run_folder, cfg, args.resume)
            GRPOTrainer(config=cfg).train(resume_from_checkpoint=resume)  # checks the world size once
    except RunInterrupted as e:  # Ctrl-C / SIGTERM: a checkpoint was saved (GRPO and DPO alike)
        again = " ".join(["grouprl train", *(["-c", args.config] if args.config else []), *args.overrides])
        print(f"grouprl: stopped after step {e.step}; checkpoint saved in {e.checkpoint}. Continue with: "
              f"{again} --resume", file=sys.stderr)
        return e.exit_code
    return 0

