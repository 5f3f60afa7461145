// Lays out the run report from the JSON data block; every number was computed in Python.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("grouprl-data").textContent);
  var CFG = {displaylogo: false, responsive: true, displayModeBar: false};
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in (attrs || {})) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "number") return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : String(Math.round(v * 1e4) / 1e4);
    return typeof v === "object" ? JSON.stringify(v) : String(v);
  }

  function drawPanels() {
    var box = document.getElementById("plots");
    if (!box) return;
    D.panels.forEach(function (p) {
      var div = el("div", {id: p.id, "class": "plot"});
      box.appendChild(div);
      var traces = [];
      D.runs.forEach(function (run, ri) {
        var cols = run.columns;
        p.keys.forEach(function (k) {
          if (!cols[k]) return;
          var x = [], y = [];
          cols.step.forEach(function (s, i) { var v = cols[k][i]; if (typeof v === "number") { x.push(s); y.push(v); } });
          var name = D.runs.length > 1 ? (ri === 0 ? "A " : "B ") + k : k;
          traces.push({x: x, y: y, name: name, mode: x.length < 3 ? "lines+markers" : "lines",
            yaxis: p.secondary.indexOf(k) >= 0 ? "y2" : "y", line: {dash: ri ? "dash" : "solid"}});
        });
      });
      var layout = {title: {text: p.title, font: {size: 13}}, margin: {l: 60, r: 50, t: 30, b: 35},
        legend: {font: {size: 10}, orientation: "h", y: -0.12},
        yaxis: {exponentformat: "e"}, yaxis2: {overlaying: "y", side: "right", showgrid: false}};
      var ys = [].concat.apply([], traces.filter(function (t) { return t.yaxis === "y"; }).map(function (t) { return t.y; }));
      if (ys.length && Math.min.apply(null, ys) === Math.max.apply(null, ys) && ys[0] !== 0) {
        var pad = Math.abs(ys[0]) * 0.5;  // a constant curve: centre it instead of plotly's +-1 default
        layout.yaxis.range = [ys[0] - pad, ys[0] + pad];
      }
      Plotly.newPlot(div, traces, layout, CFG);
    });
  }

  function drawHist() {
    var h = D.histograms, div = document.getElementById("hist");
    if (!div) return;
    if (!h || !h.windows || !h.windows.length) { div.textContent = "No training samples logged."; div.className = "muted"; return; }
    var centres = h.edges.slice(0, -1).map(function (e, i) { return (e + h.edges[i + 1]) / 2; });
    var frac = h.windows.map(function (w) {
      var n = w.counts.reduce(function (a, b) { return a + b; }, 0);
      return w.counts.map(function (c) { return c / n; });
    });
    var label = function (w) { return "steps " + w.window[0] + "-" + w.window[1]; };
    if (h.windows.length > 4) {  // many windows: one column per window, colour = fraction of samples
      var z = centres.map(function (_, b) { return frac.map(function (f) { return f[b]; }); });
      Plotly.newPlot(div, [{type: "heatmap", x: h.windows.map(label), y: centres, z: z, colorscale: "Viridis",
        colorbar: {title: {text: "fraction"}}}], {margin: {l: 60, r: 20, t: 10, b: 60},
        yaxis: {title: {text: "reward"}}}, CFG);
      return;
    }
    var traces = h.windows.map(function (w, i) {
      return {type: "bar", x: centres, y: frac[i], name: label(w), opacity: 0.6};
    });
    Plotly.newPlot(div, traces, {barmode: "overlay", margin: {l: 50, r: 20, t: 10, b: 35},
      xaxis: {title: {text: "reward"}}, yaxis: {title: {text: "fraction of samples"}}}, CFG);
  }

  function table(head, rows) {
    var t = el("table"), tr = el("tr");
    head.forEach(function (h) { tr.appendChild(el("th", {}, h)); });
    t.appendChild(tr);
    rows.forEach(function (r) { t.appendChild(r); });
    return t;
  }
  function row(cells, cls) {
    var tr = el("tr", cls ? {"class": cls} : {});
    cells.forEach(function (c) { var td = el("td"); if (c instanceof Node) td.appendChild(c); else td.textContent = fmt(c); tr.appendChild(td); });
    return tr;
  }

  function drawChangelog() {
    var box = document.getElementById("changelog-body");
    if (!box) return;
    if (!D.changelog || !D.changelog.length) { box.appendChild(el("p", {"class": "muted"}, "No reward_changelog in this run's config.")); return; }
    box.appendChild(table(["step", "reason", "expected effect", "measured (mean after - before)"], D.changelog.map(function (c) {
      var m = Object.keys(c.measured).map(function (k) { var e = c.measured[k]; return k + ": " + fmt(e.before) + " -> " + fmt(e.after) + " (" + (e.change >= 0 ? "+" : "") + fmt(e.change) + ")"; }).join("\n");
      return row([c.step === undefined ? "(run)" : c.step, c.reason || "", c.expected_effect || "", el("span", {"class": "tok"}, m)]);
    })));
  }

  // ---- sample review -----------------------------------------------------------------------
  var KEY = "grouprl-marks:" + (D.run_key || "");
  var marks = {};
  (D.marks || []).forEach(function (m) { marks[m.id] = m; });
  try { var saved = JSON.parse(window.localStorage.getItem(KEY) || "{}"); for (var id in saved) marks[id] = saved[id]; } catch (e) { /* storage may be off for file:// pages */ }
  function saveMarks() {
    try { window.localStorage.setItem(KEY, JSON.stringify(marks)); } catch (e) { /* ignore */ }
    var n = Object.keys(marks).filter(function (k) { return marks[k].mark; }).length;
    var c = document.getElementById("mark-count"); if (c) c.textContent = n + " marked";
  }
  function markButtons(s) {
    var span = el("span");
    [["right", "looks right"], ["hack", "looks like a hack"]].forEach(function (b) {
      var btn = el("button", {"class": b[0]}, b[1]);
      function paint() { btn.className = b[0] + (marks[s.id] && marks[s.id].mark === b[0] ? " on" : ""); }
      btn.addEventListener("click", function () {
        var cur = marks[s.id] && marks[s.id].mark;
        marks[s.id] = {id: s.id, step: s.step, mark: cur === b[0] ? null : b[0]};
        saveMarks(); Array.prototype.forEach.call(span.children, function (x) { x.dispatchEvent(new Event("paint")); });
      });
      btn.addEventListener("paint", paint); paint(); span.appendChild(btn);
    });
    return span;
  }
  function sign(a) { return typeof a !== "number" || a === 0 ? "zero" : (a > 0 ? "pos" : "neg"); }
  function tokenView(s) {
    var box = el("div", {"class": "tok"});
    var advAt = function (i) { return Array.isArray(s.advantage) ? s.advantage[i] : s.advantage; };
    var mask = s.loss_mask, toks = s.tokens || s.completion_ids || s.token_ids;
    if (Array.isArray(toks)) {
      toks.forEach(function (t, i) {
        var masked = Array.isArray(mask) && mask[i] === 0;
        box.appendChild(el("span", {"class": masked ? "masked" : sign(advAt(i)), title: "token " + i + (masked ? " (masked)" : "")},
          typeof t === "number" ? "\u27e8" + t + "\u27e9" : t));
      });
    } else if (Array.isArray(s.messages)) {
      s.messages.forEach(function (m) {
        if (m.role === "system" || m.role === "user") return;
        var cls = m.role === "assistant" ? sign(advAt(0)) : "masked";
        var text = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
        box.appendChild(el("div", {"class": cls, title: m.role}, "[" + m.role + "] " + text));
      });
    } else {
      box.appendChild(el("span", {"class": sign(advAt(0))}, s.completion || ""));
    }
    return box;
  }
  function sampleRow(s) {
    var prompt = el("details"); prompt.appendChild(el("summary", {}, String(s.prompt || "").slice(0, 60)));
    prompt.appendChild(el("div", {"class": "tok"}, s.prompt || ""));
    var comps = el("span", {"class": "tok"}, Object.keys(s.rewards || {}).map(function (k) { return k + "=" + fmt(s.rewards[k]); }).join("\n"));
    var extra = s.num_turns !== undefined ? "\nturns " + s.num_turns + (s.end_reason ? ", " + s.end_reason : "") : "";
    return row([s.step, s.reward, comps, Array.isArray(s.advantage) ? "per-token" : s.advantage,
      s.length + " " + s.length_unit + (s.truncated ? " (cut)" : "") + extra, prompt, tokenView(s), markButtons(s)]);
  }
  function drawReview() {
    var box = document.getElementById("review-body");
    if (!box) return;
    if (!D.review || !D.review.length) { box.appendChild(el("p", {"class": "muted"}, "No training samples logged (samples.jsonl).")); return; }
    var head = ["step", "reward", "components", "advantage", "length", "prompt", "completion", "mark"];
    D.review.forEach(function (w, i) {
      var d = el("details", {id: "review-" + w.window[0]}); if (i === D.review.length - 1) d.open = true;
      var hacks = w.top.concat(w.bottom).filter(function (s) { return marks[s.id] && marks[s.id].mark === "hack"; }).length;
      d.appendChild(el("summary", {}, "steps " + w.window[0] + "-" + w.window[1] + " (" + w.n + " samples" +
        (hacks ? ", " + hacks + " marked as a hack" : "") + ")"));
      d.appendChild(el("h3", {}, "Highest reward (" + w.top.length + ")")); d.appendChild(table(head, w.top.map(sampleRow)));
      d.appendChild(el("h3", {}, "Lowest reward (" + w.bottom.length + ")")); d.appendChild(table(head, w.bottom.map(sampleRow)));
      box.appendChild(d);
    });
    document.getElementById("download-marks").addEventListener("click", function () {
      var list = Object.keys(marks).map(function (k) { return marks[k]; });
      var blob = new Blob([JSON.stringify({run: D.run_key, marks: list}, null, 1)], {type: "application/json"});
      var a = el("a", {href: URL.createObjectURL(blob), download: "marks.json"}); document.body.appendChild(a); a.click(); a.remove();
    });
    saveMarks();
  }

  function drawCompare() {
    var rb = document.getElementById("reward-diff-body");
    if (rb) rb.appendChild(table(["reward", "changed", "A", "B"], D.reward_diff.map(function (r) {
      function brief(x) { return x ? el("span", {"class": "tok"}, "weight " + fmt(x.weight) + "\noptions " + JSON.stringify(x.options) + "\nsha256 " + String(x.source_sha256).slice(0, 12) + (x.schedule ? "\nschedule " + JSON.stringify(x.schedule) : "")) : "(absent)"; }
      return row([r.name, r.changed.join(", ") || "unchanged", brief(r.a), brief(r.b)], r.changed.length ? "changed" : "");
    })));
    var cb = document.getElementById("config-diff-body");
    if (cb) cb.appendChild(D.config_diff.length ? table(["key", "A", "B"], D.config_diff.map(function (c) { return row([c.key, c.a, c.b], "changed"); }))
      : el("p", {"class": "muted"}, "The configs are identical (output paths aside)."));
  }

  drawPanels(); drawHist(); drawChangelog(); drawReview();
  if (D.kind === "compare") drawCompare();
  document.body.setAttribute("data-rendered", "yes");
})();
