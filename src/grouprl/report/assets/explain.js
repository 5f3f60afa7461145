// Draws the explainers from the JSON data block (computed by grouprl.algo). The only math here is the
// group z-score behind the editable input; on load it is run on the embedded examples and its results are
// written to #js-check, which a test compares with grouprl.algo.ADVANTAGES.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("grouprl-data").textContent);
  var CFG = {displaylogo: false, responsive: true, displayModeBar: false};
  var M = {l: 50, r: 20, t: 30, b: 40};

  function mean(r) { return r.reduce(function (a, b) { return a + b; }, 0) / r.length; }
  function std(r, unbiased) {
    var m = mean(r), n = r.length - (unbiased ? 1 : 0);
    if (n <= 0) return 0;
    return Math.sqrt(r.reduce(function (a, b) { return a + (b - m) * (b - m); }, 0) / n);
  }
  var EPS = D.advantage.eps;
  var JS_ADV = {
    "grpo": function (r) { var m = mean(r), s = std(r, false); return r.map(function (x) { return s < EPS ? 0 : (x - m) / (s + EPS); }); },
    "grpo (std unbiased)": function (r) { var m = mean(r), s = std(r, true); return r.map(function (x) { return s < EPS ? 0 : (x - m) / (s + EPS); }); },
    "dr_grpo": function (r) { var m = mean(r); return r.map(function (x) { return x - m; }); },
    "rloo": function (r) { var m = mean(r), n = r.length; return r.map(function (x) { return n > 1 ? (x - m) * n / (n - 1) : 0; }); }
  };
  function r4(v) { return Math.round(v * 1e4) / 1e4; }

  document.getElementById("js-check").textContent = JSON.stringify(D.advantage.examples.map(function (ex) {
    var o = {}; D.advantage.methods.forEach(function (m) { o[m] = JS_ADV[m](ex.rewards); }); return o;
  }));

  var t = document.createElement("table"), head = "<tr><th>rewards</th>" + D.advantage.methods.map(function (m) { return "<th>" + m + "</th>"; }).join("") + "</tr>";
  t.innerHTML = head + D.advantage.examples.map(function (ex) {
    return "<tr><td>" + ex.rewards.join(", ") + "</td>" + D.advantage.methods.map(function (m) { return "<td class='tok'>" + ex.adv[m].map(r4).join(", ") + "</td>"; }).join("") + "</tr>";
  }).join("");
  document.getElementById("adv-table").appendChild(t);

  var input = document.getElementById("adv-input");
  function drawAdv() {
    var r = input.value.split(/[\s,]+/).filter(function (s) { return s !== ""; }).map(Number);
    if (!r.length || r.some(isNaN)) { document.getElementById("adv-out").textContent = "type numbers separated by commas"; return; }
    var x = r.map(function (_, i) { return "completion " + (i + 1); });
    var traces = [{type: "bar", x: x, y: r, name: "reward"}].concat(D.advantage.methods.map(function (m) {
      return {type: "bar", x: x, y: JS_ADV[m](r), name: "adv " + m};
    }));
    document.getElementById("adv-out").textContent = "mean " + r4(mean(r)) + ", std " + r4(std(r, false));
    Plotly.react("adv-plot", traces, {barmode: "group", margin: M, title: {text: "rewards and advantages", font: {size: 13}}}, CFG);
  }
  input.addEventListener("input", drawAdv); drawAdv();

  var O = D.objective;
  document.getElementById("seq-len").textContent = O.seq_len;
  function lines(part, field, title, div, xlabel) {
    var traces = [];
    Object.keys(O[part]).forEach(function (sign) {
      Object.keys(O[part][sign]).forEach(function (label, i) {
        traces.push({x: O.ratios, y: O[part][sign][label][field], name: sign + " " + label, mode: "lines",
          line: {dash: sign === "A<0" ? "dash" : "solid", color: ["#1f77b4", "#d62728", "#2ca02c"][i]}});
      });
    });
    Plotly.newPlot(div, traces, {title: {text: title, font: {size: 13}}, margin: M, legend: {font: {size: 10}, orientation: "h", y: -0.22},
      xaxis: {title: {text: xlabel}}}, CFG);
  }
  lines("token", "objective", "objective vs ratio r (one token, |A| = 1)", "obj-token", "ratio r");
  lines("sequence", "objective", "sequence objective vs one token's ratio", "obj-seq", "ratio of token 1");
  lines("token", "grad", "d objective / d log pi(token)", "grad-token", "ratio r");
  lines("sequence", "grad", "d objective / d log pi(token 1)", "grad-seq", "ratio of token 1");

  var K = D.kl, colors = {k1: "#1f77b4", k2: "#ff7f0e", k3: "#2ca02c"};
  Plotly.newPlot("kl-sample", Object.keys(K.per_sample).map(function (k) {
    return {x: K.log_ratios, y: K.per_sample[k], name: k, mode: "lines", line: {color: colors[k]}};
  }), {title: {text: "one sample's estimate", font: {size: 13}}, margin: M, xaxis: {title: {text: "log(pi_ref / pi_theta)"}}}, CFG);
  var tr = [{x: K.shifts, y: K.exact, name: "exact KL", mode: "lines", line: {color: "black", width: 3}}];
  Object.keys(K.mean).forEach(function (k) {
    tr.push({x: K.shifts, y: K.mean[k], name: "E[" + k + "]", mode: "lines", line: {color: colors[k]}});
    tr.push({x: K.shifts, y: K.mean[k].map(function (m, i) { return m + K.std[k][i]; }), name: k + " +1 std", mode: "lines", line: {color: colors[k], dash: "dot", width: 1}});
  });
  Plotly.newPlot("kl-mean", tr, {title: {text: "expectation under pi_theta vs exact KL", font: {size: 13}}, margin: M,
    xaxis: {title: {text: "reference shift delta"}}, yaxis: {range: [-1, 4]}}, CFG);
  document.body.setAttribute("data-rendered", "yes");
})();
