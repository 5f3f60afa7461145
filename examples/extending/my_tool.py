"""Tool plug-ins: a stateless tool function, and an environment class (TRL's ``environment_factory``).

A tool is a plain function with a type hint on every argument and a Google-style docstring; its JSON
schema (what the model is shown) is built from them by ``transformers.utils.get_json_schema``. An
environment is a class built fresh for each trajectory: ``reset(**row)`` starts it, every other public
method is a tool, and ``get_reward()`` is its own reward.
"""

from __future__ import annotations

from grouprl.registry import ENVIRONMENTS

_TO_METRES = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "mi": 1609.344}


def convert_length(value: float, from_unit: str, to_unit: str) -> float:
    """Convert a length between units.

    Args:
        value: The length to convert.
        from_unit: Unit of value: one of mm, cm, m, km, in, ft, mi.
        to_unit: Unit of the result: one of mm, cm, m, km, in, ft, mi.
    """
    for unit in (from_unit, to_unit):
        if unit not in _TO_METRES:
            raise ValueError(f"unknown unit {unit!r}; use one of {', '.join(_TO_METRES)}")
    return round(value * _TO_METRES[from_unit] / _TO_METRES[to_unit], 6)


@ENVIRONMENTS.register("lengths")
class LengthEnv:
    """One trajectory: the model may call ``convert`` and ``submit``; the reward is 1.0 when the submitted
    number is the row's ``answer`` (to 1e-6), else 0.0."""

    def reset(self, answer=None, **row):
        self.answer, self.submitted, self.calls = answer, None, 0
        return None

    def convert(self, value: float, from_unit: str, to_unit: str) -> float:
        """Convert a length between units.

        Args:
            value: The length to convert.
            from_unit: Unit of value: one of mm, cm, m, km, in, ft, mi.
            to_unit: Unit of the result: one of mm, cm, m, km, in, ft, mi.
        """
        self.calls += 1
        return convert_length(value, from_unit, to_unit)

    def submit(self, value: float) -> str:
        """Submit the final answer.

        Args:
            value: The answer, as a number.
        """
        self.submitted = value
        return "submitted"

    def get_reward(self) -> float:
        if self.submitted is None or self.answer is None:
            return 0.0
        return 1.0 if abs(self.submitted - float(self.answer)) <= 1e-6 else 0.0
