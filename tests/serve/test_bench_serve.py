"""benchmarks/serve.py plumbing: the table it prints from its JSON (the timings themselves are not tested)."""

from __future__ import annotations

import importlib.util
import pathlib

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "serve.py"


def test_the_markdown_table_shows_medians_ranges_and_ratios():
    spec = importlib.util.spec_from_file_location("bench_serve", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = {"clients": 4, "requests_per_s": 30.0, "requests_per_s_range": [20.0, 40.0], "output_tokens_per_s": 300.0,
           "output_tokens_per_s_range": [250.0, 320.0]}
    other = {"clients": 4, "requests_per_s": 10.0, "output_tokens_per_s": 120.0}
    table = module.markdown({"grouprl": [row], "transformers": [other]})
    assert table.splitlines()[-1] == "| 4 | 30.0 (20.0-40.0) | 10.0 (10.0-10.0) | 3.00x | 300.0 (250.0-320.0) | 120.0 (120.0-120.0) | 2.50x |"
