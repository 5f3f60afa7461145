"""``grouprl train --nproc N``: start N training processes with accelerate's own launcher.

The command becomes ``python -m accelerate.commands.launch --num_processes N [--cpu | --multi_gpu]
-m grouprl train <the same arguments>``: a subprocess, so accelerate sets up every rank's environment
exactly as ``accelerate launch`` typed by hand would (docs/DISTRIBUTED.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from grouprl.errors import ConfigError


def launch_command(args: argparse.Namespace, cfg: Any, cuda: bool) -> list[str]:
    """The accelerate command line for ``args`` (``--nproc`` dropped; ``--cpu`` unless CUDA is used)."""
    n = args.nproc
    if n < 1:
        raise ConfigError(f"--nproc {n}: give the number of training processes (>= 1), e.g. --nproc 2.")
    on_gpu = cuda and cfg.device != "cpu"
    device = ["--multi_gpu"] if on_gpu and n > 1 else [] if on_gpu else ["--cpu"]
    train = ["train", *(["-c", args.config] if args.config else []), *args.overrides]
    if args.resume is not None:
        train += ["--resume"] + ([] if args.resume is True else [str(args.resume)])
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", *device, "-m", "grouprl", *train]


def launch(args: argparse.Namespace, cfg: Any) -> int:
    """Run the training on ``args.nproc`` processes; the exit status is accelerate's."""
    import torch

    command = launch_command(args, cfg, torch.cuda.is_available())
    print("grouprl: " + " ".join(command[1:]), file=sys.stderr)
    return subprocess.call(command)
