"""The report from synthetic logs: data parsed back from the HTML, review tables, histograms, changelog,
marks folding, --compare, reward identity, and the layering rule (report/ never imports the trainer)."""

from __future__ import annotations

import ast
import json
import pathlib

import pytest
import report_synth as synth

from grouprl.cli import main
from grouprl.errors import ConfigError
from grouprl.report import build_report, reward_identity, write_run_meta
from grouprl.report.page import parse_data, plotly_js

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "grouprl"


@pytest.fixture
def run(tmp_path):
    cfg = {"reward_changelog": [{"reason": "format weight 0.5", "expected_effect": "more tags", "step": 51}]}
    return synth.write_run(tmp_path / "run", synth.healthy_metrics(), synth.samples(agent=True), config=cfg)


def test_report_is_self_contained_and_holds_every_logged_key(run):
    page = build_report(run).read_text()
    assert plotly_js() in page  # the bundle inline; nothing else may point outside the file
    rest = page.replace(plotly_js(), "")
    assert "src=" not in rest and "http" not in rest and "<link" not in rest
    data = parse_data(page)
    logged = {k for r in synth.healthy_metrics() for k in r if k != "step"}
    assert set(data["metric_keys"]) == logged
    assert set(data["runs"][0]["columns"]) == logged | {"step"}
    assert data["runs"][0]["columns"]["reward"][4] == synth.healthy_metrics()[4]["reward"]
    plotted = [k for p in data["panels"] for k in p["keys"]]
    assert sorted(plotted) == sorted(logged - {"eval/tag"})  # every numeric key in exactly one panel
    ids = [p["id"] for p in data["panels"]]
    assert ids[:4] == ["panel-reward", "panel-components", "panel-component_spread", "panel-eval"]
    assert data["alerts"] == []


def test_review_takes_the_highest_and_lowest_per_window(tmp_path):
    rows = [{"step": s, "prompt": f"p{s}-{i}", "completion": f"c{i}", "reward": float(i), "advantage": 0.0}
            for s in (10, 60, 150) for i in range(50)]
    path = synth.write_run(tmp_path / "r", synth.healthy_metrics(150), rows)
    data = parse_data(build_report(path, review_window=100).read_text())
    assert [w["window"] for w in data["review"]] == [[0, 100], [101, 200]]
    first = data["review"][0]
    assert first["n"] == 100 and len(first["top"]) == 20 and len(first["bottom"]) == 20
    assert [s["reward"] for s in first["top"][:3]] == [49.0, 49.0, 48.0]
    assert [s["reward"] for s in first["bottom"][:3]] == [0.0, 0.0, 1.0]
    small = data["review"][1]  # 50 samples: 20 + 20, disjoint
    assert {s["id"] for s in small["top"]}.isdisjoint({s["id"] for s in small["bottom"]})
    hist = data["histograms"]
    assert len(hist["edges"]) == 21 and [sum(w["counts"]) for w in hist["windows"]] == [100, 50]


def test_review_rows_carry_components_advantage_length_and_token_data(run):
    row = parse_data(build_report(run).read_text())["review"][0]["top"][0]
    assert set(row["rewards"]) == {"accuracy", "format"} and row["advantage"] == 0.5
    assert row["length"] == 6 and row["length_unit"] == "tokens"
    assert row["loss_mask"] == [1, 1, 1, 0, 1, 1] and row["tokens"][3] == "7" and row["num_turns"] == 2


def test_changelog_shows_the_measured_effect(run):
    entry = parse_data(build_report(run, review_window=10).read_text())["changelog"][0]
    assert entry["reason"] == "format weight 0.5" and entry["before"] == [41, 50] and entry["after"] == [51, 60]
    m = synth.healthy_metrics()
    before = sum(r["reward"] for r in m[40:50]) / 10
    after = sum(r["reward"] for r in m[50:60]) / 10
    assert entry["measured"]["reward"]["change"] == pytest.approx(after - before)


def test_marks_fold_into_the_run_and_show_in_the_next_report(run, tmp_path, capsys):
    sid = parse_data(build_report(run).read_text())["review"][0]["top"][0]["id"]
    marks = tmp_path / "marks.json"
    marks.write_text(json.dumps({"run": "x", "marks": [{"id": sid, "step": 100, "mark": "hack"}]}))
    assert main(["report", str(run), "--marks", str(marks)]) == 0
    assert main(["report", str(run), "--marks", str(marks)]) == 0  # same mark again: not duplicated
    assert "folded 0 new mark" in capsys.readouterr().out
    lines = (run / "review_marks.jsonl").read_text().splitlines()
    assert [json.loads(x)["mark"] for x in lines] == ["hack"]
    data = parse_data((run / "report.html").read_text())
    assert data["marks"] == [{"id": sid, "step": 100, "mark": "hack"}]
    assert [r.get("mark") for r in data["review"][0]["top"] if r["id"] == sid] == ["hack"]
    marks.write_text(json.dumps({"marks": [{"id": sid, "mark": "maybe"}]}))
    with pytest.raises(ConfigError, match="'mark' in"):
        from grouprl.report import fold_marks
        fold_marks(run, marks)


def test_compare_shows_reward_and_config_changes_and_both_curves(tmp_path):
    a = synth.write_run(tmp_path / "a", synth.healthy_metrics(), config={"learning_rate": 1e-5})
    b = synth.write_run(tmp_path / "b", synth.healthy_metrics(50), config={"learning_rate": 3e-5,
                                                                           "reward_weights": [1.0, 0.2]})
    out = tmp_path / "cmp.html"
    assert main(["report", "--compare", str(a), str(b), "-o", str(out)]) == 0
    data = parse_data(out.read_text())
    assert data["kind"] == "compare" and [r["name"] for r in data["runs"]] == ["a", "b"]
    assert len(data["runs"][1]["columns"]["step"]) == 50
    assert {"key": "learning_rate", "a": 1e-5, "b": 3e-5} in data["config_diff"]
    assert not [c for c in data["config_diff"] if c["key"] == "output_dir"]
    fmt = [r for r in data["reward_diff"] if r["name"] == "format"][0]
    assert fmt["changed"] == ["weight"] and fmt["a"]["weight"] == 0.5 and fmt["b"]["weight"] == 0.2


def test_reward_identity_hashes_the_source(tmp_path, monkeypatch):
    mod = tmp_path / "my_rewards.py"
    mod.write_text("def short(completion, **kw):\n    return -len(completion)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ids = reward_identity(["accuracy", "my_rewards:short"], {"accuracy": {"task_type": "math"}}, [1.0, 0.1],
                          schedule={"my_rewards:short": [[0, 0.1], [50, 0.0]]})
    acc, short = ids
    assert acc["kind"] == "registry" and acc["options"] == {"task_type": "math"} and len(acc["source_sha256"]) == 64
    assert short["kind"] == "import" and short["weight"] == 0.1 and short["schedule"] == [[0, 0.1], [50, 0.0]]
    import hashlib
    assert short["source_sha256"] == hashlib.sha256(mod.read_bytes()).hexdigest()
    assert acc["grouprl_version"] and acc["module"].startswith("grouprl.rewards")

    def lam(completion, **kw):
        return 1.0
    assert reward_identity([lam])[0]["name"].endswith(":test_reward_identity_hashes_the_source.<locals>.lam")
    path = write_run_meta(tmp_path / "run", ["accuracy"], weights=[2.0])
    meta = json.loads(path.read_text())
    assert path.name == "run_meta.json" and meta["rewards"][0]["weight"] == 2.0


def test_compare_flags_an_edited_reward(tmp_path):
    ra = reward_identity(["accuracy"])
    rb = [dict(ra[0], source_sha256="0" * 64)]
    a = synth.write_run(tmp_path / "a", synth.healthy_metrics(), meta={"rewards": ra})
    b = synth.write_run(tmp_path / "b", synth.healthy_metrics(), meta={"rewards": rb})
    from grouprl.report import build_compare
    data = parse_data(build_compare(a, b).read_text())
    assert data["reward_diff"][0]["changed"] == ["source_sha256"]


def test_errors_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="holds no metrics.jsonl"):
        build_report(tmp_path)
    assert main(["report"]) == 2
    run = synth.write_run(tmp_path / "r", synth.healthy_metrics(20))
    with pytest.raises(ConfigError, match="--review-window 0"):
        build_report(run, review_window=0)


def test_report_package_never_imports_the_trainer():
    bad = []
    for path in sorted((SRC / "report").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}: {n}" for n in names if n.startswith(("grouprl.train", "grouprl.rollout"))]
    assert not bad


def test_review_keeps_repeated_completions_apart(tmp_path):
    """A group often holds the same completion twice: both copies count, top and bottom stay 20 + 20."""
    rows = [{"step": 5, "prompt": "p", "completion": f"c{i % 10}", "reward": float(i % 10), "advantage": 0.0}
            for i in range(40)]
    path = synth.write_run(tmp_path / "r", synth.healthy_metrics(10), rows)
    w = parse_data(build_report(path).read_text())["review"][0]
    assert len(w["top"]) == 20 and len(w["bottom"]) == 20
    assert sorted(r["reward"] for r in w["top"]) == [5.0] * 4 + [6.0] * 4 + [7.0] * 4 + [8.0] * 4 + [9.0] * 4
    assert w["top"][0]["length"] == 2 and w["top"][0]["length_unit"] == "chars"


def test_a_run_still_writing_its_logs_can_be_reported(tmp_path):
    path = synth.write_run(tmp_path / "r", synth.healthy_metrics(30), synth.samples(30))
    with (path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 31, "reward": 0.')  # the trainer is mid-write
    data = parse_data(build_report(path).read_text())
    assert data["runs"][0]["columns"]["step"][-1] == 30
    (path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        build_report(path)
