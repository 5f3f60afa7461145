"""A damaged cache entry (a truncated model file, a cut pairs file) is detected, named and rebuilt."""

from __future__ import annotations

import json
from pathlib import Path

from grouprl.builtin import warmstart
from grouprl.data import prefs

TINY = {"sft_steps": 3, "sft_rows": 40, "vocab_size": 300}


def test_a_truncated_warm_start_is_named_and_rebuilt(tmp_path, capsys):
    first = Path(warmstart.builtin_model_path("arithmetic", cache_dir=tmp_path, **TINY))
    weights = first / "model.safetensors"
    whole = weights.read_bytes()
    info = json.loads((first / warmstart.INFO_FILE).read_text())
    assert info["files"]["model.safetensors"][0] == len(whole)
    capsys.readouterr()
    weights.write_bytes(whole[: len(whole) // 2])
    again = Path(warmstart.builtin_model_path("arithmetic", cache_dir=tmp_path, **TINY))
    err = capsys.readouterr().err
    assert again == first
    assert f"the cached builtin:arithmetic in {first} is damaged (model.safetensors: {len(whole) // 2:,} bytes, " \
           f"not the {len(whole):,} it was built with); rebuilding it" in err
    assert (again / "model.safetensors").read_bytes() == whole  # the build is deterministic
    assert warmstart.cache_damage(again) is None


def test_an_entry_from_before_the_file_record_is_checked_by_its_header(tmp_path):
    entry = Path(warmstart.builtin_model_path("arithmetic", cache_dir=tmp_path, **TINY))
    info = json.loads((entry / warmstart.INFO_FILE).read_text())
    del info["files"]
    (entry / warmstart.INFO_FILE).write_text(json.dumps(info))
    assert warmstart.cache_damage(entry) is None
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:-10])
    damage = warmstart.cache_damage(entry)
    assert damage.startswith(f"model.safetensors: {size - 10:,} bytes, its header needs {size:,}")
    weights.write_bytes(b"\x00" * 4)
    assert "unreadable safetensors header" in warmstart.cache_damage(entry)


def test_cut_preference_pairs_are_rebuilt(tmp_path, capsys):
    path = tmp_path / "prefs" / "x-123"
    pairs = [{"prompt": f"p{i}", "chosen": "a", "rejected": "b"} for i in range(5)]
    prefs.save_cached(path, pairs, {"budget": 40})
    assert prefs.load_cached(path) == (pairs, {"budget": 40})
    lines = (path / prefs.PAIRS_FILE).read_text().splitlines()
    (path / prefs.PAIRS_FILE).write_text("\n".join(lines[:3]) + "\n")  # whole lines lost: still valid JSON
    assert prefs.load_cached(path) is None
    assert "are damaged (ValueError: 3 pairs where 5 were built); rebuilding them" in capsys.readouterr().err
    assert not path.exists()
    prefs.save_cached(path, pairs, {"budget": 40})
    (path / prefs.PAIRS_FILE).write_text('{"prompt": "p0", "cho')
    assert prefs.load_cached(path) is None and not path.exists()
