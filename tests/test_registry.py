"""The Registry: lookups, helpful errors, plug-in resolution and keyword checks."""

from __future__ import annotations

import pytest

from grouprl.errors import ConfigError, UnknownNameError
from grouprl.registry import Registry


def _make():
    reg = Registry("policy loss")

    @reg.register("grpo")
    def grpo(logp, old_logp, adv, mask, *, eps_low=0.2, eps_high=0.2):
        """PPO-clip per token."""
        return logp

    @reg.register("gspo")
    def gspo(logp, old_logp, adv, mask, *, eps_low=3e-4, eps_high=4e-4):
        """Sequence-level ratio."""
        return logp

    return reg


def test_get_and_names():
    reg = _make()
    assert reg.names() == ["grpo", "gspo"]
    assert reg.get("grpo")(1, 2, 3, 4) == 1
    assert "gspo" in reg and len(reg) == 2
    assert reg.describe("gspo") == "Sequence-level ratio."


def test_unknown_name_lists_known_and_closest():
    reg = _make()
    with pytest.raises(UnknownNameError) as e:
        reg.get("gpso")
    msg = str(e.value)
    assert "grpo, gspo" in msg and "Closest match: 'gspo'" in msg


def test_duplicate_registration_is_an_error():
    reg = _make()
    with pytest.raises(ValueError, match="already registered"):
        reg.register("grpo", lambda *a: None)


def test_resolve_plugin():
    reg = _make()
    assert reg.get("os.path:join")("a", "b") == "a/b"
    with pytest.raises(UnknownNameError, match="no attribute"):
        reg.get("os.path:jion")
    with pytest.raises(UnknownNameError, match="cannot import"):
        reg.get("no_such_module_xyz:fn")


def test_check_kwargs_did_you_mean():
    reg = _make()
    reg.check_kwargs("grpo", {"eps_low": 0.1})
    with pytest.raises(ConfigError) as e:
        reg.check_kwargs("grpo", {"eps_hihg": 0.3}, where="loss_kwargs")
    msg = str(e.value)
    assert "eps_hihg" in msg and "Did you mean 'eps_high'" in msg and "loss_kwargs" in msg
