"""The page shell shared by the run report and the explainers: one self-contained HTML file.

Plots are drawn by plotly.js, whose bundle is inlined from the ``plotly`` package (no CDN, no network: the
file opens from disk). The page's data is one ``<script type="application/json">`` block, so tests (and
users) can parse back exactly what was drawn. The small hand-written script in ``assets/`` only lays the
data out; every number is computed in Python.
"""

from __future__ import annotations

import functools
import html
import json
import math
from importlib import resources
from typing import Any

DATA_ID = "grouprl-data"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .sub{color:#b8c0cc;font-size:13px}main{padding:16px 24px;max-width:1400px}
section{background:#fff;border:1px solid #e1e4ea;border-radius:6px;padding:12px 16px;margin:12px 0}
h2{font-size:16px;margin:4px 0 10px}.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:10px}
.plot{height:300px;border:1px solid #eef0f3;border-radius:4px}.plot.tall{height:420px}.alert{border-left:4px solid #d9822b;background:#fff7ec;padding:6px 10px;margin:6px 0}
.ok{border-left:4px solid #2e9e5b;background:#effaf3;padding:6px 10px}table{border-collapse:collapse;width:100%;font-size:13px}
td,th{border-bottom:1px solid #eef0f3;padding:4px 6px;text-align:left;vertical-align:top}th{background:#fafbfc}
.num{text-align:right;font-variant-numeric:tabular-nums}.tok{white-space:pre-wrap;font-family:ui-monospace,Menlo,monospace;font-size:12px}
.pos{background:#d8f3df}.neg{background:#fbdada}.zero{background:#eef0f3}.masked{background:#e4e4e4;color:#8a8f98}
.changed{background:#fff3cd}button{font-size:12px;margin:1px;cursor:pointer}button.on.right{background:#2e9e5b;color:#fff}
button.on.hack{background:#c0392b;color:#fff}details>summary{cursor:pointer;font-weight:600}.muted{color:#6b7280}
code{background:#f0f2f5;padding:0 3px;border-radius:3px}
"""


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js, from the installed ``plotly`` package (its own offline bundle)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def asset(name: str) -> str:
    return resources.files("grouprl.report").joinpath("assets", name).read_text(encoding="utf-8")


def _finite(x: Any) -> Any:
    """JSON has no NaN/Infinity: they become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def data_json(data: Any) -> str:
    """JSON safe inside a <script> element (``</`` escaped)."""
    return json.dumps(_finite(data), default=str, allow_nan=False).replace("</", "<\\/")


def render(title: str, subtitle: str, body_html: str, data: Any, script: str) -> str:
    """The whole page: CSS, static body, the data block, plotly.js and the page script."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1><div class=\"sub\">{html.escape(subtitle)}</div></header>"
        f"<main>{body_html}</main>"
        f"<script type=\"application/json\" id=\"{DATA_ID}\">{data_json(data)}</script>"
        f"<script>{plotly_js()}</script><script>{asset(script)}</script></body></html>\n"
    )


def parse_data(page: str) -> Any:
    """The data block of a page written by :func:`render` (used by tests and ``--compare``)."""
    start = page.index(f'id="{DATA_ID}">') + len(f'id="{DATA_ID}">')
    return json.loads(page[start: page.index("</script>", start)])
