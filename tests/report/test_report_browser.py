"""A real browser (headless Chromium) opens the report and the explainer from disk: no console message,
no network request from the page, the plots drawn (pixels, not just DOM), and the explainer's JavaScript
z-score agrees with grouprl.algo on the embedded examples.

Needs Debian's ``chromium`` (``apt-get install -y chromium``); skipped with the reason when it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import report_synth as synth

from grouprl.report import build_compare, build_report
from grouprl.report.explain import build_explain
from grouprl.report.page import parse_data

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: apt-get install -y chromium")
PLOT_COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]  # plotly's first traces


def chromium(page, tmp_path, *args, timeout=120):
    """Run headless Chromium on file://page; returns (stdout, stderr, the page's own network requests)."""
    profile, netlog = tmp_path / "profile", tmp_path / "net.json"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-extensions",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", f"--log-net-log={netlog}",
           "--virtual-time-budget=5000", "--window-size=1400,2000", *args, f"file://{page}"]
    env = {**os.environ, "HOME": str(tmp_path)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    events = json.loads(netlog.read_text()).get("events", []) if netlog.exists() else []
    requests = {e["params"]["url"] for e in events
                if "file://" in str(e.get("params", {}).get("network_isolation_key", ""))
                and "url" in e.get("params", {})
                and not e["params"]["url"].startswith(("file:", "blob:", "data:"))}
    return p.stdout, p.stderr, requests


def console_lines(stderr):
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def plot_pixels(png):
    from PIL import Image

    img = Image.open(png).convert("RGB")
    hits = sum(n for n, c in img.getcolors(maxcolors=1 << 24)
               if any(sum(abs(a - b) for a, b in zip(c, ref)) < 30 for ref in PLOT_COLOURS))
    return hits, img.size


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    d = tmp_path_factory.mktemp("pages")
    run = synth.write_run(d / "run", synth.healthy_metrics(), synth.samples(agent=True))
    other = synth.write_run(d / "other", synth.healthy_metrics(60), config={"learning_rate": 3e-5})
    return {"report": build_report(run), "explain": build_explain(d / "explain.html"),
            "compare": build_compare(run, other, d / "compare.html")}


@pytest.mark.parametrize("name", ["report", "explain", "compare"])
def test_page_loads_from_disk_without_errors_or_network(pages, name, tmp_path):
    dom, stderr, requests = chromium(pages[name], tmp_path, "--dump-dom")
    assert 'data-rendered="yes"' in dom, f"the page script did not finish:\n{stderr[-3000:]}"
    assert console_lines(stderr) == []
    assert requests == set()
    assert dom.count("main-svg") >= {"report": 10, "explain": 6, "compare": 10}[name]  # plotly drew its SVGs
    if name == "report":  # per-token view: tool tokens greyed, model tokens coloured by advantage sign
        assert 'class="masked"' in dom and 'class="pos"' in dom and 'class="neg"' in dom
    if name == "compare":
        assert "learning_rate" in dom and 'class="changed"' in dom


@pytest.mark.parametrize("name", ["report", "explain"])
def test_screenshot_shows_plots(pages, name, tmp_path):
    png = tmp_path / f"{name}.png"
    _, stderr, requests = chromium(pages[name], tmp_path, f"--screenshot={png}")
    assert png.exists(), stderr[-3000:]
    hits, size = plot_pixels(png)
    assert size == (1400, 2000) and hits > 2000, f"only {hits} pixels in plot trace colours: plots not drawn"
    assert requests == set() and console_lines(stderr) == []


def test_a_page_that_fetches_is_caught(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<html><body><script>console.log("x")</script><img src="http://192.0.2.1/x.png"></body></html>')
    _, stderr, requests = chromium(page, tmp_path, "--dump-dom", timeout=60)
    assert requests == {"http://192.0.2.1/x.png"} and len(console_lines(stderr)) == 1


def test_explainer_javascript_matches_grouprl_algo(pages, tmp_path):
    dom, _, _ = chromium(pages["explain"], tmp_path, "--dump-dom")
    start = dom.index('id="js-check"')
    js = json.loads(dom[dom.index(">", start) + 1: dom.index("</pre>", start)].replace("&quot;", '"'))
    examples = parse_data(pages["explain"].read_text())["advantage"]["examples"]
    assert len(js) == len(examples)
    for from_js, ex in zip(js, examples):
        for method, values in ex["adv"].items():
            assert from_js[method] == pytest.approx(values, abs=1e-9), (ex["rewards"], method)


def test_folded_marks_show_as_pressed_buttons(tmp_path):
    run = synth.write_run(tmp_path / "run", synth.healthy_metrics(), synth.samples())
    sid = parse_data(build_report(run).read_text())["review"][0]["top"][0]["id"]
    (run / "review_marks.jsonl").write_text(json.dumps({"id": sid, "step": 100, "mark": "hack"}) + "\n")
    dom, _, _ = chromium(build_report(run), tmp_path, "--dump-dom")
    assert dom.count('class="hack on"') == 1 and dom.count('class="right on"') == 0
    assert "1 marked as a hack" in dom
