"""``grouprl reward score``: per-sample table, summary, zero-std groups, per-line errors."""

from __future__ import annotations

import json

from grouprl.cli import main

WORKED = (
    "<think>\n需要计算圆的面积：S = π × r² = π × 5² ≈ 78.54\n</think>\n"
    "<tool_call>calculator(expression='3.14159 * 5**2')</tool_call>"
)


def _write(tmp_path, lines):
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _samples(tmp_path):
    return _write(
        tmp_path,
        [
            json.dumps({"completion": WORKED, "answer": "78.54", "gid": 1}),
            json.dumps({"completion": "\\boxed{78.54}", "answer": "78.54", "gid": 1}),
            '{"completion": "broken", "answer": ',
            json.dumps({"completion": "no idea", "answer": "3", "gid": 2}),
            json.dumps({"completion": "none either", "answer": "3", "gid": 2}),
            json.dumps({"text": "wrong field"}),
        ],
    )


def test_composite_table_summary_and_line_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # rich sizes the table to the terminal
    rc = main(["reward", "score", "--input", _samples(tmp_path), "--group-key", "gid"])
    out, err = capsys.readouterr()
    assert rc == 1  # two lines could not be scored, the others were
    assert "line 3: invalid JSON" in err and "line 6: expected a JSON object with a 'completion' field" in err
    for header in ("accuracy", "format", "efficiency", "safety", "total"):
        assert header in out
    # line 1 is the worked example: 1.0, 0.8, 1.0, 1.0 -> 0.96
    assert "1.0000 │ 0.8000 │     1.0000 │ 1.0000 │ 0.9600" in out
    assert "zero-std groups: 1/2 (50.0%)" in out  # group 2 (both wrong, 0.3 each) ties; group 1 does not


def test_json_output_for_a_named_reward_with_options(tmp_path, capsys):
    rc = main(
        [
            "reward",
            "score",
            "-r",
            "math",
            "-o",
            "strict=true",
            "--input",
            _samples(tmp_path),
            "--group-key",
            "gid",
            "--json",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 1
    rows = [json.loads(x) for x in lines[:-1]]
    assert [(r["line"], r["group"], r["math"]) for r in rows] == [
        (1, 1, 0.0),
        (2, 1, 1.0),
        (4, 2, 0.0),
        (5, 2, 0.0),
    ]
    summary = json.loads(lines[-1])
    assert summary["summary"]["dimensions"]["math"]["mean"] == 0.25
    assert summary["summary"]["zero_std_fraction"] == 0.5
    assert summary["errors"][0].startswith("line 3:")


def test_clean_file_exits_zero_and_unknown_reward_is_an_error(tmp_path, capsys):
    path = _write(tmp_path, [json.dumps({"completion": "\\boxed{2}", "answer": "2"})])
    assert main(["reward", "score", "-r", "math", "--input", path]) == 0
    assert main(["reward", "score", "-r", "mathh", "--input", path]) == 2
    assert "unknown reward 'mathh'" in capsys.readouterr().err


def test_a_mistyped_option_is_an_error_not_ignored(tmp_path, capsys):
    path = _write(tmp_path, [json.dumps({"completion": "\\boxed{2}", "answer": "2"})])
    assert main(["reward", "score", "-r", "math", "-o", "strcit=true", "--input", path]) == 2
    assert "takes no option 'strcit' (in --option). Did you mean 'strict'?" in capsys.readouterr().err
    assert main(["reward", "score", "-o", "tolerence=0.1", "--input", path]) == 2  # composite
    assert "Did you mean 'tolerance'?" in capsys.readouterr().err
    assert main(["reward", "score", "--config", "mth", "--input", path]) == 2
    assert "--config 'mth': use one of default, math, code, retrieval. Did you mean 'math'?" in capsys.readouterr().err
