"""The results site's one page: HTML, CSS and the script that renders the embedded data with Plotly.

The page (``index.html``) loads ``plotly.min.js`` from its own folder (Plotly's offline bundle, shipped next to it
by :mod:`kvbench.reporting.site`: no CDN, no server; it opens from disk), or has it inlined (``--single-file``), and
reads its data from the ``<script id="kvbench-data" type="application/json">`` element.  Everything visible is drawn
by the script below (and the views of :mod:`kvbench.reporting.site_views`: ``#headline``, ``#pivot``,
``#breakdowns``, ``#length-plots``, ``#predictions``) from that data, and drawn again when a filter (model, task, question mode, experiment) changes:

* ``#leaderboards`` ("All runs"): one table per model × task, rows ``tr.lb-row`` (``data-run-id``), score cells
  ``td.score`` (``data-column``, ``data-score``: the exact value), the 95 % interval, the paper's printed value, the
  best compressed method per budget and question mode in bold (``.best``);
* ``#budget-plots``: score vs tokens per layer per dataset and the mean, one line per method in its palette colour
  with its 95 % interval as a band, one full-cache dashed line, a small-n flag in the title;
* ``#memory-plots``: bytes stored vs tokens kept, and cache bytes vs budget (the full cache a line);
* ``#needles``: the needle heatmaps of one chosen dataset, every run side by side (depth 0-100 %);
* ``#provenance``: every run's commit, versions, device, status and data provenance.

A run on stand-in data (or a made-up synthetic run) carries a warning badge in every view it appears in.
"""

from __future__ import annotations

PAGE_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<link rel="icon" href="data:,">
<title>__TITLE__</title>
<style>
body { font-family: system-ui, sans-serif; margin: 0 1.5em 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
nav a { margin-right: 1em; }
#filters { position: sticky; top: 0; background: #f6f6f6; padding: .5em; border-bottom: 1px solid #ddd; z-index: 5; }
#filters label { margin-right: 1em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0 1em; }
th, td { border: 1px solid #ddd; padding: .2em .45em; text-align: right; vertical-align: top; }
th { background: #f0f0f0; } td.key { text-align: left; }
td.best .value { font-weight: bold; }
.ci, .paper { display: block; font-size: .8em; color: #666; }
.paper { color: #1f5fa8; }
.flag { background: #c62828; color: #fff; border-radius: 3px; padding: 0 .3em; font-size: .75em; margin-left: .3em; }
#banner { background: #fff3e0; border: 1px solid #c62828; padding: .4em; margin: .5em 0; }
.plot { display: inline-block; width: 600px; height: 460px; }
details pre { text-align: left; font-size: .8em; white-space: pre-wrap; }
.muted { color: #777; }
table.pivot th.sortable { cursor: pointer; text-decoration: underline dotted; }
table.pivot td .mean { font-weight: bold; } table.pivot tr.full-row { background: #f4f4f4; }
.diff, .mem, .speed { display: block; font-size: .78em; color: #555; } .diff.neg { color: #b71c1c; }
.swatch { display: inline-block; width: .8em; height: .8em; border-radius: 2px; margin-right: .3em; }
.smalln { color: #b26a00; font-size: .75em; margin-left: .2em; }
.warning { background: #fff8e1; border-left: 3px solid #f9a825; padding: .2em .5em; font-size: .85em; }
.plot.small { width: 380px; height: 320px; }
table.preds td, table.preds th { text-align: left; max-width: 28em; white-space: pre-wrap; word-break: break-word; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
<p class="muted" id="meta"></p>
<div id="filters"></div>
<div id="banner" hidden></div>
<nav><a href="#headline">Headline</a><a href="#pivot">Leaderboard</a><a href="#budget-plots">Score vs budget</a>
<a href="#memory-plots">Memory</a><a href="#breakdowns">Breakdowns</a><a href="#length-plots">Accuracy vs length</a>
<a href="#needles">Needles</a><a href="#predictions">Predictions</a>
<a href="#leaderboards">All runs</a><a href="#provenance">Provenance</a></nav>
<h2>Headline: mean score vs stored bytes</h2><div id="headline"></div>
<h2>Leaderboard: methods × budgets</h2><div id="pivot"></div>
<h2>Score vs budget</h2><div id="budget-plots"></div>
<h2>Memory</h2><div id="memory-plots"></div>
<h2>Breakdowns: the sub-scores beside the headline</h2><div id="breakdowns"></div>
<h2>Accuracy vs generated length</h2><div id="length-plots"></div>
<h2>Needle heatmaps</h2><div id="needles"></div>
<h2>Predictions</h2><div id="predictions"></div>
<h2>All runs</h2><div id="leaderboards"></div>
<h2>Provenance</h2><div id="provenance"></div>
__PLOTLY__
<script id="kvbench-data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("kvbench-data").textContent);
const FILTERS = ["model", "task", "question_mode", "experiment"];
const state = {};
const RUNS = Object.fromEntries(DATA.runs.map(r => [r.run_id, r]));

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k.startsWith("data-")) node.setAttribute(k, v); else node[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}
function fmt(x, d) { return x === null || x === undefined ? "–" : Number(x).toFixed(d); }
const FLAG_TITLES = {"stand-in": "scored on stand-in data: not comparable with published numbers",
  "synthetic": "made-up numbers, not a measurement", "incomplete": "the run did not complete (run_meta.json status)",
  "disagrees": "a metrics.json disagrees with its predictions.jsonl: that score is left out; rerun to rewrite it",
  "mixed-code": "rows computed by several versions of kvbench's code",
  "stale-rows": "rows kept from data or method inputs that changed since (run.changed_inputs=keep)"};
function flags(list) { return (list || []).map(f => el("span", {class: "flag", title: FLAG_TITLES[f] || f}, "⚠ " + f)); }
function label(run) {
  const tag = run.tag && run.tag !== run.question_mode ? "~" + run.tag : "";
  return labelOf(run.method) + tag + (run.question_mode !== "aware" ? " (" + run.question_mode + ")" : "");
}
function colourOf(method) { return (DATA.palette[method] || {}).colour || "#444"; }  // kvbench.reporting.palette
function labelOf(method) { return (DATA.palette[method] || {}).label || method; }
function lineStyle(run) {  // one colour per method (the same on every site); dotted: question-agnostic, dashed: another tag
  return {color: colourOf(run.method), dash: run.question_mode !== "aware" ? "dot" : (run.tag ? "dashdot" : "solid")};
}
function band(name, xs, ci, colour, group) {  // the 95 % interval as a filled band (upper edge, then lower edge)
  const pts = xs.map((x, i) => [x, ci[i]]).filter(p => p[1]);
  if (!pts.length) return [];
  return [{type: "scatter", mode: "lines", x: pts.map(p => p[0]), y: pts.map(p => p[1][1]), line: {width: 0},
           showlegend: false, hoverinfo: "skip", legendgroup: group},
          {type: "scatter", mode: "lines", x: pts.map(p => p[0]), y: pts.map(p => p[1][0]), line: {width: 0},
           fill: "tonexty", fillcolor: colour + "22", showlegend: false, hoverinfo: "skip", legendgroup: group,
           name: name + " 95 % interval"}];
}
function budgetAxis(xs) {
  const ticks = [...new Set(xs)].sort((a, b) => a - b);
  return {title: {text: "tokens per layer"}, type: "log", tickvals: ticks, ticktext: ticks.map(t => String(+t.toFixed(1)))};
}
function visible(run) { return FILTERS.every(f => !state[f] || run[f] === state[f]); }
function visibleRuns() { return DATA.runs.filter(visible); }

function buildFilters() {
  const box = document.getElementById("filters");
  for (const f of FILTERS) {
    const select = el("select", {id: "filter-" + f});
    select.append(el("option", {value: ""}, "all"));
    for (const v of DATA.filters[f]) select.append(el("option", {value: v}, v));
    select.addEventListener("change", () => { state[f] = select.value; render(); });
    box.append(el("label", {}, f.replace("_", " ") + " ", select));
  }
  box.append(el("span", {id: "row-count", class: "muted"}));
}

function renderLeaderboards() {
  const box = document.getElementById("leaderboards");
  box.replaceChildren();
  let shown = 0;
  for (const board of DATA.leaderboards) {
    const rows = board.rows.filter(r => visible(RUNS[r.run_id]));
    if (!rows.length) continue;
    shown += rows.length;
    const head = el("tr", {}, ...["method", "budget", "tag", "question mode", "experiment", "kept"].map(h => el("th", {}, h)),
      ...board.columns.map(c => el("th", {}, c)));
    const table = el("table", {class: "leaderboard", "data-model": board.model, "data-task": board.task}, head);
    for (const row of rows) {
      const tr = el("tr", {class: "lb-row", "data-run-id": row.run_id},
        el("td", {class: "key"}, row.method, ...flags(row.flags)), el("td", {class: "key"}, row.budget),
        el("td", {class: "key"}, row.tag || ""), el("td", {class: "key"}, row.question_mode),
        el("td", {class: "key"}, row.experiment), el("td", {}, row.kept_fraction === null ? "–" : fmt(100 * row.kept_fraction, 1) + "%"));
      for (const c of board.columns) {
        const cell = row.cells[c];
        const td = el("td", {class: "score" + (cell.best ? " best" : ""), "data-column": c,
          "data-score": cell.score === null ? "" : String(cell.score)}, el("span", {class: "value"}, fmt(cell.score, 2)));
        if (cell.ci95) td.append(el("span", {class: "ci"}, "[" + fmt(cell.ci95[0], 1) + ", " + fmt(cell.ci95[1], 1) + "]"));
        if (cell.paper) td.append(el("span", {class: "paper", title: "the paper's printed value"}, "paper " + cell.paper));
        tr.append(td);
      }
      table.append(tr);
    }
    box.append(el("h3", {}, board.model + " · " + board.task), table);
  }
  document.getElementById("row-count").textContent = shown + " runs shown";
  if (!shown) box.append(el("p", {class: "muted"}, "no run matches the filters"));
}

function plot(box, traces, layout) {
  const div = el("div", {class: "plot"});
  box.append(div);
  Plotly.newPlot(div, traces, Object.assign({margin: {t: 40, r: 10, b: 40},
    legend: {font: {size: 10}, orientation: "h", y: -0.25}}, layout),
    {displaylogo: false, displayModeBar: false, responsive: true});
}

function groupBy(items, keyOf) {
  const out = new Map();
  for (const it of items) { const k = keyOf(it); if (!out.has(k)) out.set(k, []); out.get(k).push(it); }
  return out;
}

function pickFull(group) {  // one full-cache reference (the run under budget "full" first), whatever budgets it ran with
  return group.filter(r => r.method === "full").sort((a, b) => (a.budget !== "full") - (b.budget !== "full"))[0];
}
function smallN(runs) { return runs.some(r => r.n_min !== null && r.n_min < SMALL_N); }

function renderBudgetPlots(runs) {
  const box = document.getElementById("budget-plots");
  box.replaceChildren();
  for (const [key, group] of groupBy(runs, r => r.model + " · " + r.task)) {
    const datasets = [...new Set(group.flatMap(r => Object.keys(r.scores)))].sort();
    const comp = group.filter(r => r.method !== "full" && r.x !== null);
    const xs = comp.map(r => r.x);
    const full = pickFull(group);
    const nNote = smallN(comp) ? " · ⚠ n<" + SMALL_N + " per dataset" : "";
    for (const ds of [...datasets, "mean"]) {
      const traces = [];
      const val = r => ds === "mean" ? r.mean : r.scores[ds];
      for (const [name, series] of groupBy(comp, label)) {
        series.sort((a, b) => a.x - b.x);
        const pts = series.filter(r => val(r));
        const stand = pts.some(r => r.flags.length) ? " ⚠" : "";
        const style = lineStyle(series[0]);
        traces.push(...band(name, pts.map(r => r.x), pts.map(r => val(r).ci95), style.color, name));
        traces.push({type: "scatter", mode: "lines+markers", name: name + stand, legendgroup: name, x: pts.map(r => r.x),
          line: style, marker: {color: style.color}, y: pts.map(r => val(r).score),
          text: pts.map(r => r.budget + " (n=" + r.n_min + ")" + (r.flags.length ? " ⚠ " + r.flags.join(", ") : "")),
          hovertemplate: "%{text}: %{y:.2f}<extra>" + name + "</extra>"});
      }
      const fv = full ? val(full) : null;
      if (fv && xs.length) traces.push({type: "scatter", mode: "lines", name: "Full cache" + (full.flags.length ? " ⚠" : ""),
        x: [Math.min(...xs), Math.max(...xs)], y: [fv.score, fv.score], line: {dash: "dash", color: "black"},
        hovertemplate: "full cache: %{y:.2f}<extra></extra>"});
      if (traces.length) plot(box, traces, {title: {text: key + " · " + ds + nNote, font: {size: 13}},
        xaxis: budgetAxis(xs), yaxis: {title: {text: "score"}}});
    }
  }
}

function renderMemoryPlots(runs) {
  const box = document.getElementById("memory-plots");
  box.replaceChildren();
  for (const [key, group] of groupBy(runs, r => r.model + " · " + r.task)) {
    const comp = group.filter(r => r.method !== "full");
    const full = pickFull(group);
    const stored = [], bytes = [];
    for (const [name, series] of groupBy(comp, label)) {
      series.sort((a, b) => (a.x || 0) - (b.x || 0));
      const style = lineStyle(series[0]);
      const k = series.filter(r => r.kept_fraction !== null && r.stored_fraction !== null);
      stored.push({type: "scatter", mode: "lines+markers", name: name, line: style, marker: {color: style.color},
        x: k.map(r => r.kept_fraction), y: k.map(r => r.stored_fraction), text: k.map(r => r.budget),
        hovertemplate: "%{text}: tokens kept %{x:.1%}, bytes stored %{y:.1%}<extra>" + name + "</extra>"});
      const b = series.filter(r => r.cache_bytes !== null && r.x !== null);
      bytes.push({type: "scatter", mode: "lines+markers", name: name, line: style, marker: {color: style.color},
        x: b.map(r => r.x), y: b.map(r => r.cache_bytes / 1048576), text: b.map(r => r.budget),
        hovertemplate: "%{text}: %{y:.2f} MiB<extra>" + name + "</extra>"});
    }
    const xs = comp.filter(r => r.x !== null).map(r => r.x);
    if (full && full.cache_bytes !== null && xs.length) bytes.push({type: "scatter", mode: "lines", name: "Full cache",
      x: [Math.min(...xs), Math.max(...xs)], y: [full.cache_bytes / 1048576, full.cache_bytes / 1048576],
      line: {dash: "dash", color: "black"}, hovertemplate: "full cache: %{y:.2f} MiB<extra></extra>"});
    plot(box, stored, {title: {text: key + " · bytes stored vs tokens kept", font: {size: 13}},
      xaxis: fractionAxis("tokens kept (fraction of the context)", comp.map(r => r.kept_fraction).filter(x => x)),
      yaxis: fractionAxis("bytes stored (fraction of the full cache)", comp.map(r => r.stored_fraction).filter(x => x))});
    plot(box, bytes, {title: {text: key + " · cache size vs budget", font: {size: 13}},
      xaxis: budgetAxis(xs), yaxis: {title: {text: "cache MiB (mean per sample)"}}});
  }
}

function renderNeedles(runs) {  // one dataset at a time, every run side by side (depth 0-100 %)
  const box = document.getElementById("needles");
  box.replaceChildren();
  const withGrid = runs.filter(r => DATA.needles[r.run_id]);
  if (!withGrid.length) { box.append(el("p", {class: "muted"}, "no run with needle depths in its predictions")); return; }
  const datasets = [...new Set(withGrid.flatMap(r => Object.keys(DATA.needles[r.run_id])))].sort();
  const select = el("select", {id: "needle-dataset"});
  for (const d of datasets) select.append(el("option", {value: d}, d));
  const plots = el("div", {});
  const draw = () => {
    plots.replaceChildren();
    const order = [...withGrid].sort((a, b) => (a.method !== "full") - (b.method !== "full") || a.method.localeCompare(b.method) || (a.x || 0) - (b.x || 0));
    for (const run of order) {
      const grid = DATA.needles[run.run_id][select.value];
      if (!grid) continue;
      const div = el("div", {class: "plot small"});
      plots.append(div);
      Plotly.newPlot(div, [{type: "heatmap", x: grid.lengths.map(String), y: grid.depths, z: grid.z, zmin: 0, zmax: 100,
        colorscale: [[0, "#d7191c"], [0.5, "#fdae61"], [1, "#1a9641"]], showscale: false,
        hovertemplate: "length %{x}, depth %{y}%: %{z:.1f}<extra></extra>"}],
        {title: {text: label(run) + " · " + run.budget + (run.flags.length ? " ⚠" : ""), font: {size: 11, color: colourOf(run.method)}},
         margin: {t: 30, r: 10, b: 40, l: 45}, xaxis: {title: {text: "context length"}, type: "category"},
         yaxis: {title: {text: "needle depth %"}, range: [0, 100], tickvals: [0, 25, 50, 75, 100]}},
        {displaylogo: false, displayModeBar: false, responsive: true});
    }
  };
  select.addEventListener("change", draw);
  box.append(el("label", {}, "dataset ", select), plots);
  draw();
}

function renderProvenance(runs) {
  const box = document.getElementById("provenance");
  box.replaceChildren();
  const head = el("tr", {}, ...["run", "experiment", "commit", "kvbench", "torch", "transformers", "device", "status", "config hash", "details"].map(h => el("th", {}, h)));
  const table = el("table", {id: "provenance-table"}, head);
  for (const r of runs) {
    const p = r.provenance || {};
    table.append(el("tr", {class: "prov-row", "data-run-id": r.run_id}, el("td", {class: "key"}, r.run_id, ...flags(r.flags)),
      el("td", {class: "key"}, r.experiment), el("td", {class: "key"}, (p.git_commit || "–").slice(0, 12)),
      el("td", {}, p.kvbench_version || "–"), el("td", {}, p.torch_version || "–"), el("td", {}, p.transformers_version || "–"),
      el("td", {class: "key"}, p.device || "–"), el("td", {}, p.status || "–"), el("td", {}, p.config_hash || "–"),
      el("td", {class: "key"}, el("details", {}, el("summary", {}, "all"),
        el("pre", {}, JSON.stringify({provenance: p, data_provenance: r.data_provenance, stand_in: r.stand_in, folder: r.folder}, null, 1))))));
  }
  box.append(table);
}

function render() {
  const runs = visibleRuns();
  const flagged = runs.filter(r => r.flags.length);
  const banner = document.getElementById("banner");
  banner.hidden = !flagged.length;
  banner.textContent = flagged.length ? "⚠ " + flagged.length + " of the runs shown are stand-in data or made-up (synthetic) numbers; "
    + "they carry a ⚠ badge wherever they appear and are not comparable with published results." : "";
  renderHeadline(); renderPivot(); renderLeaderboards(); renderBudgetPlots(runs); renderMemoryPlots(runs);
  renderBreakdowns(); renderLengthPlots(); renderNeedles(runs); renderPredictions(runs); renderProvenance(runs);
}

__VIEWS__
document.getElementById("meta").textContent = DATA.runs.length + " runs from " + DATA.root + " · built " + DATA.generated_at
  + " · kvbench " + DATA.kvbench_version + " · Plotly " + DATA.plotly_version;
buildFilters();
render();
document.body.setAttribute("data-rendered", "1");
</script>
</body>
</html>
"""
