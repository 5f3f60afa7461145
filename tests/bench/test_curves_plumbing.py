"""Plumbing of ``benchmarks/curves.py`` (the one command for every recipe's curve) and of
``benchmarks/retrieval_curve.py --reuse``, without training anything."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import curves  # noqa: E402
import retrieval_curve  # noqa: E402

R = "benchmarks/results"
EXPECTED = {
    "agent_calculator": [["benchmarks/agent_curve.py", "--grid", "--ws-seeds", "0", "1", "2", "--rl-seeds", "0", "1",
                          "2", "--jobs", "1", "--eval-steps", "25", "--out", f"{R}/agent_calculator_grid.json"]],
    "code_repair": [["benchmarks/code_repair_curve.py", "--cells", "0:0", "0:1", "0:2", "1:0", "1:1", "1:2",
                     "--out", f"{R}/code_repair.json"]],
    "retrieval": [["benchmarks/retrieval_curve.py", "--judge-only", "--out", f"{R}/retrieval.json"],
                  ["benchmarks/retrieval_curve.py", "--judge-from", f"{R}/retrieval_judge.json", "--seeds", "0", "1",
                   "2", "--out", f"{R}/retrieval.json"]],
    "guess_number": [["benchmarks/env_recipes.py", "guess_number", "--seeds", "0", "1", "2", "--out",
                      f"{R}/guess_number.json"]],
    "reasoning_gym": [["benchmarks/env_recipes.py", "reasoning_gym", "--seeds", "0", "1", "2", "--out",
                       f"{R}/reasoning_gym.json"]],
}


def commands(plan: list[dict]) -> dict[str, list[list[str]]]:
    for curve in plan:
        for step in curve["steps"]:
            assert step["command"][0] == sys.executable
    return {c["name"]: [s["command"][1:] for s in c["steps"]] for c in plan}


def test_dry_run_lists_every_recipe_with_its_documented_command(capsys):
    assert curves.main(["--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] is True
    assert commands(out["curves"]) == EXPECTED  # all five, in this order, nothing skipped without --reuse
    assert [c["name"] for c in out["curves"]] == list(EXPECTED)
    assert all(s["skip"] is None for c in out["curves"] for s in c["steps"])
    outputs = {c["name"]: c["steps"][-1]["outputs"] for c in out["curves"]}
    assert outputs["retrieval"] == [f"{R}/retrieval.json", f"{R}/retrieval.png"]
    assert outputs["agent_calculator"] == [f"{R}/agent_calculator_grid.json", f"{R}/agent_calculator_grid.png"]


def test_every_flag_exists_in_the_script_it_is_given_to():
    for steps in EXPECTED.values():
        for args in steps:
            source = (ROOT / args[0]).read_text()
            for flag in [a for a in args[1:] if a.startswith("--")] + ["--reuse"] * (args[0] != "benchmarks/env_recipes.py"):
                assert re.search(rf'"{flag}"', source), f"{args[0]} has no {flag}"


def test_reuse_goes_only_to_scripts_that_keep_cells_and_skips_a_finished_judge(tmp_path):
    plan = curves.plan(["retrieval", "guess_number", "code_repair"], reuse=True, root=tmp_path)
    got = commands(plan)
    assert got["retrieval"][1][-1] == "--reuse" and got["code_repair"][0][-1] == "--reuse"
    assert "--reuse" not in got["guess_number"][0]  # env_recipes.py has no --reuse: it runs in full
    assert "--reuse" not in got["retrieval"][0]
    assert plan[0]["steps"][0]["skip"] is None  # no judge JSON yet under this root: the judge part runs
    (tmp_path / R).mkdir(parents=True)
    (tmp_path / R / "retrieval_judge.json").write_text("{}")
    plan = curves.plan(["retrieval"], reuse=True, root=tmp_path)
    assert plan[0]["steps"][0]["skip"] == "--reuse: its outputs exist" and plan[0]["steps"][1]["skip"] is None


def test_unknown_name_is_one_clear_error():
    with pytest.raises(SystemExit, match="unknown curve 'retreival'; known: agent_calculator, code_repair, retrieval"):
        curves.main(["--only", "retreival", "--dry-run"])


def test_run_curve_stops_at_a_failed_step_or_an_unwritten_output(tmp_path):
    calls = []

    def runner(rc_for_first, write):
        def run(command, timeout_s, root):
            calls.append(command)
            for p in write:
                (root / p).parent.mkdir(parents=True, exist_ok=True)
                (root / p).write_text("{}")
            return (rc_for_first if len(calls) == 1 else 0), 0.5
        return run

    plan = curves.plan(["retrieval"], reuse=False, root=tmp_path)[0]
    done = curves.run_curve(json.loads(json.dumps(plan)), 10, tmp_path, runner(2, []))
    assert done["ok"] is False and len(calls) == 1 and done["steps"][0]["rc"] == 2
    assert "rc" not in done["steps"][1]  # the seeds need the judge part: not started

    calls.clear()  # exit 0 but the PNG was never written: a failure naming it
    written = [f"{R}/retrieval_judge.json", f"{R}/retrieval.json"]
    done = curves.run_curve(json.loads(json.dumps(plan)), 10, tmp_path, runner(0, written))
    assert len(calls) == 2 and done["ok"] is False and done["steps"][1]["not_written"] == [f"{R}/retrieval.png"]

    calls.clear()
    done = curves.run_curve(json.loads(json.dumps(plan)), 10, tmp_path, runner(0, [*written, f"{R}/retrieval.png"]))
    assert done["ok"] is True and [s["not_written"] for s in done["steps"]] == [[], []]


def test_run_step_passes_the_exit_status_and_kills_at_the_deadline(tmp_path):
    assert curves._run_step([sys.executable, "-c", "import sys; sys.exit(3)"], 30, tmp_path)[0] == 3
    t0 = time.perf_counter()
    rc, wall = curves._run_step([sys.executable, "-c", "import time; time.sleep(60)"], 1, tmp_path)
    assert rc == "timeout after 1 s" and time.perf_counter() - t0 < 20 and wall >= 1


def fake_run(seed: int, acc: float) -> dict:
    point = {"accuracy": acc, "searches": 1.0, "n": 20}
    curve = [{"step": s, **{k: dict(point) for k in ("train_greedy", "train_sampled", "heldout_greedy",
                                                     "heldout_sampled")}} for s in (0, 20)]
    return {"seed": seed, "curve": curve, "per_step": [{"step": 20, "time/step": 2.0}], "judge_agreement": 0.5}


def test_retrieval_reuse_keeps_finished_seeds_and_refuses_other_overrides(tmp_path, monkeypatch):
    out = tmp_path / "retrieval.json"
    out.write_text(json.dumps({"overrides": [], "judge": {"heldout": {}}, "runs": [fake_run(0, 0.25)],
                               "load_average_start": [99.0] * 3, "load_average_end": [98.0] * 3}))
    trained = []
    monkeypatch.setattr(retrieval_curve, "run_seed", lambda seed, args: trained.append(seed) or fake_run(seed, 0.75))
    monkeypatch.setattr(retrieval_curve, "plot", lambda report, path: path.write_text("png"))
    args = type("A", (), {"seeds": [0, 1]})()
    previous = retrieval_curve._previous(out, [])
    report = {"overrides": [], "judge": previous["judge"]}
    retrieval_curve.run_seeds(report, args, out, previous)
    assert trained == [1]  # seed 0 was in the JSON already
    written = json.loads(out.read_text())
    assert [r["seed"] for r in written["runs"]] == [0, 1]
    assert written["summary"]["train_greedy"]["after"] == [0.25, 0.75]
    # the load averages span the measuring runs: the start is the first run's, the end now's (seed 1 ran)
    assert written["load_average_start"] == [99.0] * 3 and written["load_average_end"] != [98.0] * 3
    args.seeds = [0]  # nothing to run: a re-plot keeps the measured load averages as they were
    out.write_text(json.dumps({**written, "load_average_end": [98.0] * 3}))
    previous = retrieval_curve._previous(out, [])
    report = {"overrides": [], "judge": previous["judge"]}
    retrieval_curve.run_seeds(report, args, out, previous)
    assert trained == [1] and json.loads(out.read_text())["load_average_end"] == [98.0] * 3
    with pytest.raises(SystemExit, match=r"overrides \[\], not \['max_steps=5'\]; drop --reuse"):
        retrieval_curve._previous(out, ["max_steps=5"])
    assert retrieval_curve._previous(tmp_path / "none.json", []) is None


def test_retrieval_replot_draws_the_png_from_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "retrieval.json"
    out.write_text(json.dumps({"overrides": [], "runs": [fake_run(0, 0.5), fake_run(1, 0.75)]}))
    assert retrieval_curve.main(["--replot", "--out", str(out)]) == 0
    assert (tmp_path / "retrieval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
