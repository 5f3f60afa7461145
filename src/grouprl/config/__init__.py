"""``GRPOConfig``: every knob of a GRPO / GSPO run, typed, documented and checked before a model loads.

* ``fields.py``   -- the dataclass; a docstring under each field is its documentation (``--help-config``).
* ``presets.py``  -- ``algorithm`` presets, TRL aliases, importance-sampling levels, and :func:`resolved`:
  the functions and hyper-parameters training will call.
* ``validate.py`` -- value, type and batch-arithmetic checks; registry checks at start-up.
* ``io.py``       -- YAML recipes, dotted ``key=value`` overrides, coercion of YAML values.

Batch arithmetic (TRL's convention): ``per_device_train_batch_size`` completions per micro-batch,
``gradient_accumulation_steps`` micro-batches per optimizer step, and one generation round produces
``per_device_train_batch_size * steps_per_generation`` completions, i.e. that number divided by
``num_generations`` prompts. TRL's names are accepted as aliases: ``beta`` -> ``kl_coef``,
``max_completion_length`` -> ``max_new_tokens``.

This package imports no torch and no other grouprl package above the registry, so validating a recipe is
instant; the registries are consulted lazily, inside :func:`resolved`. The ``sandbox:`` section is checked
by ``grouprl.sandbox.config.check_section`` at start-up.
"""

from grouprl.config.fields import GRPOConfig
from grouprl.config.io import apply_override
from grouprl.config.presets import (
    ALGORITHM_PRESETS,
    ALIASES,
    IMPORTANCE_LEVELS,
    resolved,
)
from grouprl.config.validate import CHOICES, REPORT_TARGETS

__all__ = ["ALGORITHM_PRESETS", "ALIASES", "CHOICES", "GRPOConfig", "IMPORTANCE_LEVELS", "REPORT_TARGETS",
           "apply_override", "resolved"]
