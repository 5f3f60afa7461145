"""``grouprl train --nproc N``: start N training processes with accelerate's own launcher.

The command becomes ``python -m accelerate.commands.launch --multi_gpu --num_processes N -m grouprl train
<the same arguments>``: a subprocess, so accelerate sets up every rank's environment exactly as
``accelerate launch`` typed by hand would (docs/DISTRIBUTED.md). ``--multi_gpu`` is accelerate's
multi-process launcher (torchrun) on GPUs and CPUs alike: accelerate 1.15 runs ``--cpu --num_processes N``
as ONE process unless an MPI hostfile is configured. On CPU the ranks join with gloo
(``ACCELERATE_USE_CPU=true`` is set when the run is on CPU).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from grouprl.errors import ConfigError


def launch_command(args: argparse.Namespace, cfg: Any, cuda: bool) -> list[str]:
    """The accelerate command line for ``args`` (``--nproc`` dropped)."""
    n = args.nproc
    if n < 1:
        raise ConfigError(f"--nproc {n}: give the number of training processes (>= 1), e.g. --nproc 2.")
    on_gpu = cuda and cfg.device != "cpu"
    device = ["--multi_gpu"] if n > 1 else [] if on_gpu else ["--cpu"]
    train = ["train", *(["-c", args.config] if args.config else []), *args.overrides]
    if args.resume is not None:
        train += ["--resume"] + ([] if args.resume is True else [str(args.resume)])
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", *device, "-m", "grouprl", *train]


def launch(args: argparse.Namespace, cfg: Any) -> int:
    """Run the training on ``args.nproc`` processes; the exit status is accelerate's."""
    import torch

    cuda = torch.cuda.is_available()
    command = launch_command(args, cfg, cuda)
    env = {**os.environ, **({} if cuda and cfg.device != "cpu" else {"ACCELERATE_USE_CPU": "true"})}
    print("grouprl: " + " ".join(command[1:]), file=sys.stderr)
    return subprocess.call(command, env=env)
