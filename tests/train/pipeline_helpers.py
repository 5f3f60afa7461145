"""Reward functions for the asynchronous-pipeline tests: module-level, so the spawned rollout worker can
import them by name (``tests/train`` is on the worker's ``sys.path``, as on the trainer's)."""

from __future__ import annotations

import os
import time

from train_helpers import char_reward

MAIN_PID = os.getpid()  # the trainer's pid when imported there; the worker imports it afresh (its own pid)


def crash_in_worker(completions, **kwargs):
    """Kills the process it runs in at once (no Python error, no traceback): a hard crash of the worker."""
    os._exit(3)


def raise_in_worker(completions, **kwargs):
    raise ValueError("reward exploded on purpose in the rollout worker")


def hang_in_worker(completions, **kwargs):
    """Never returns (within the test): a reward function stuck on a lock or a dead server."""
    time.sleep(3600)
    return char_reward(completions)


def pid_reward(completions, **kwargs):
    """The pid of the process that scored, as the reward (every completion of a call gets the same)."""
    return [float(os.getpid())] * len(completions)


def reward(completions, **kwargs):
    return char_reward(completions)


SYNCS = 0  # in the worker: how many times its backend was given new weights


class SyncCountingBackend:
    """The transformers backend, counting ``sync_weights`` calls in the process it runs in
    (``rollout_backend: "pipeline_helpers:SyncCountingBackend"``)."""

    def __init__(self, model, tokenizer, **kwargs):
        from grouprl.rollout.hf import TransformersBackend

        self.inner = TransformersBackend(model, tokenizer, **kwargs)

    def sync_weights(self, model):
        global SYNCS
        SYNCS += 1
        self.inner.sync_weights(model)

    def generate(self, prompts, n, params):
        return self.inner.generate(prompts, n, params)


def syncs_so_far(completions, **kwargs):
    """The reward of every completion: how many weight versions the sampling backend had been given."""
    return [float(SYNCS)] * len(completions)
