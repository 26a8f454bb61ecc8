"""The results site's comparison views, drawn by the page's script (:mod:`kvbench.reporting.site_page`) from the
embedded data of :mod:`kvbench.reporting.pivot`:

* ``#headline``: one chart per model × task (``.headline-plot``, ``data-model``, ``data-task``): the mean score
  against the fraction of the full cache's bytes stored (log axis), every method (× question mode) a line in its
  palette colour with its 95 % interval as a band, the full cache a horizontal dashed line, the paper's printed
  values (mean over the run's datasets) as hollow markers where a paper table has them, and the memory frontier
  (a dotted grey step line: the best score at most each number of stored bytes, over eviction, quantized KV storage
  and both; :func:`kvbench.reporting.pivot.memory_frontier`);
* ``#pivot``: one table per model × task × question mode (``table.pivot``): a row per method (``tr.pivot-row``,
  ``data-method``), a column per budget; each cell the mean, its difference to the full cache with the paired
  bootstrap interval, n (⚠ under ``SMALL_N``), bytes stored and tokens kept, prefill and decode seconds per sample;
  one full-cache reference row (``tr.full-row``); the columns sort on a click (``th.sortable``), the rows start
  ordered by their mean over the budgets;
* ``#breakdowns``: one table per model × task × dataset whose ``metrics.json`` ``scores`` hold sub-scores
  (``table.breakdown``, ``data-dataset``; :func:`kvbench.reporting.breakdowns.breakdown_tables`): a row per run
  (``tr.breakdown-row``, ``data-run-id``), the headline score, then a cell per sub-score (``td.bd-cell``,
  ``data-column``, ``data-value``);
* ``#length-plots``: for long-reasoning tasks, per dataset the score against the mean generated tokens
  (``.length-plot``), a line per method through its budgets (:func:`kvbench.reporting.breakdowns.length_charts`);
* ``#predictions``: the predictions browser: pick a dataset and a run (filtered by the page's filters): each
  sample's id, the end of its prompt, the prediction, the reference answers and the sample's score
  (``table.preds``, ``td.prediction``).
"""

from __future__ import annotations

VIEWS_SCRIPT = r"""
const SMALL_N = DATA.small_n;
function shown(table, keys) {
  return (keys || ["model", "task", "question_mode"]).every(f => !state[f] || table[f] === state[f]);
}
const FRACTION_TICKS = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1];
function fractionAxis(title, xs) {  // a log axis of fractions with a few readable ticks
  const lo = Math.min(...xs), hi = Math.max(...xs);
  const ticks = FRACTION_TICKS.filter(t => t >= lo / 1.5 && t <= hi * 1.5);
  return {title: {text: title}, type: "log", tickvals: ticks, ticktext: ticks.map(t => (100 * t) + "%")};
}
function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(x < 0.1 ? 2 : 1) + "%"; }
function secs(x) { return x === null || x === undefined ? "–" : x < 0.1 ? (1000 * x).toFixed(1) + " ms" : x.toFixed(2) + " s"; }

function renderHeadline() {
  const box = document.getElementById("headline");
  box.replaceChildren();
  for (const chart of DATA.headline) {
    if (!shown(chart, ["model", "task"])) continue;
    const series = chart.series.filter(s => !state.question_mode || s.question_mode === state.question_mode);
    const traces = [];
    const xs = series.flatMap(s => s.points.map(p => p.x));
    for (const s of series) {
      const dash = s.question_mode === "aware" ? "solid" : "dot";
      traces.push(...band(s.label, s.points.map(p => p.x), s.points.map(p => p.ci95), s.colour, s.label));
      const small = s.points.some(p => p.small_n) ? " ⚠ n<" + SMALL_N : "";
      traces.push({type: "scatter", mode: "lines+markers", name: s.label + small, legendgroup: s.label,
        x: s.points.map(p => p.x), y: s.points.map(p => p.y), line: {color: s.colour, dash: dash},
        marker: {color: s.colour, size: 7}, text: s.points.map(p => p.budget),
        hovertemplate: "%{text}: stored %{x:.2%}, score %{y:.2f}<extra>" + s.label + "</extra>"});
      const paper = s.points.filter(p => p.paper !== null);
      if (paper.length) traces.push({type: "scatter", mode: "markers", name: s.label + " (paper)", legendgroup: s.label,
        x: paper.map(p => p.x), y: paper.map(p => p.paper), text: paper.map(p => p.budget),
        marker: {symbol: "circle-open", size: 11, color: s.colour, line: {width: 2}},
        hovertemplate: "%{text}: paper %{y:.2f}<extra>" + s.label + " (paper)</extra>"});
    }
    const frontier = ((chart.frontier || {})[state.question_mode || "aware"]) || [];
    if (frontier.length > 1) traces.push({type: "scatter", mode: "lines", name: "memory frontier", x: frontier.map(p => p.x),
      y: frontier.map(p => p.y), line: {color: "#888", dash: "dot", shape: "hv", width: 3}, text: frontier.map(p => p.label + " " + p.budget),
      hovertemplate: "frontier: %{text}, stored %{x:.2%}, score %{y:.2f}<extra></extra>"});
    if (chart.full && xs.length) {
      traces.push({type: "scatter", mode: "lines", name: "Full cache", x: [Math.min(...xs, 1), 1],
        y: [chart.full.y, chart.full.y], line: {color: "black", dash: "dash"}, hovertemplate: "full cache: %{y:.2f}<extra></extra>"});
    }
    if (!traces.length) continue;
    const div = el("div", {class: "plot headline-plot", "data-model": chart.model, "data-task": chart.task});
    box.append(div);
    Plotly.newPlot(div, traces, {title: {text: chart.model + " · " + chart.task + " · mean score vs memory", font: {size: 13}},
      margin: {t: 40, r: 10, b: 40}, legend: {font: {size: 10}, orientation: "h", y: -0.25},
      xaxis: fractionAxis("bytes stored (fraction of the full cache, log)", [...xs, 1]),
      yaxis: {title: {text: "mean score over the datasets"}}}, {displaylogo: false, displayModeBar: false, responsive: true});
  }
  if (!box.children.length) box.append(el("p", {class: "muted"}, "no run matches the filters"));
}

function pivotCell(cell, isFull) {
  const td = el("td", {class: "pivot-cell", "data-mean": cell ? String(cell.mean) : ""});
  if (!cell) { td.append("–"); return td; }
  td.append(el("span", {class: "mean"}, fmt(cell.mean, 2)));
  if (cell.small_n) td.append(el("span", {class: "smalln", title: "fewer than " + SMALL_N + " samples per dataset"}, "⚠ n=" + cell.n));
  td.append(...flags(cell.flags));
  if (cell.ci95) td.append(el("span", {class: "ci"}, "[" + fmt(cell.ci95[0], 1) + ", " + fmt(cell.ci95[1], 1) + "]"));
  if (!isFull && cell.diff !== null) {
    const ci = cell.diff_ci95 ? " [" + fmt(cell.diff_ci95[0], 1) + ", " + fmt(cell.diff_ci95[1], 1) + "]" : "";
    td.append(el("span", {class: "diff" + (cell.diff < 0 ? " neg" : ""), title: "difference to the full cache, paired over the same samples (95 % bootstrap interval)"},
      "Δ full " + (cell.diff >= 0 ? "+" : "") + fmt(cell.diff, 2) + ci));
  }
  td.append(el("span", {class: "mem", title: "bytes stored / full cache's bytes · tokens kept / context"}, "bytes " + pct(cell.stored_fraction) + " · tokens " + pct(cell.kept_fraction)));
  td.append(el("span", {class: "speed", title: "seconds per sample"}, "prefill " + secs(cell.prefill_s) + " · decode " + secs(cell.decode_s)));
  td.append(el("span", {class: "muted", style: "font-size:.75em"}, "n=" + cell.n + (cell.seeds > 1 ? " · " + cell.seeds + " seeds" : "")));
  return td;
}

function renderPivot() {
  const box = document.getElementById("pivot");
  box.replaceChildren();
  for (const table of DATA.pivots) {
    if (!shown(table)) continue;
    const budgets = table.budgets.map(b => b.budget);
    const head = el("tr", {}, el("th", {class: "sortable", "data-sort": "method"}, "method"),
      el("th", {class: "sortable", "data-sort": "avg", title: "mean over the budgets"}, "avg"),
      ...budgets.map(b => el("th", {class: "sortable", "data-sort": b}, b)));
    const t = el("table", {class: "pivot", "data-model": table.model, "data-task": table.task, "data-question-mode": table.question_mode}, head);
    const body = el("tbody", {});
    const avg = row => { const v = Object.values(row.cells).map(c => c.mean); return v.reduce((a, b) => a + b, 0) / v.length; };
    const draw = (key, desc) => {
      const rows = [...table.rows].sort((a, b) => {
        if (key === "method") return a.label.localeCompare(b.label) * (desc ? -1 : 1);
        const va = key === "avg" ? avg(a) : (a.cells[key] ? a.cells[key].mean : -Infinity);
        const vb = key === "avg" ? avg(b) : (b.cells[key] ? b.cells[key].mean : -Infinity);
        return (desc ? vb - va : va - vb);
      });
      body.replaceChildren();
      if (table.full) {
        const fr = el("tr", {class: "full-row"}, el("td", {class: "key"}, el("span", {class: "swatch", style: "background:#000"}), "Full cache (" + table.full.budget + ")"),
          el("td", {}, fmt(table.full.mean, 2)));
        const cell = pivotCell(table.full, true);
        cell.colSpan = Math.max(budgets.length, 1);
        cell.style.textAlign = "center";
        fr.append(cell);
        body.append(fr);
      }
      for (const row of rows) {
        const tr = el("tr", {class: "pivot-row", "data-method": row.method},
          el("td", {class: "key"}, el("span", {class: "swatch", style: "background:" + row.colour}), row.label),
          el("td", {}, fmt(avg(row), 2)));
        for (const b of budgets) tr.append(pivotCell(row.cells[b] || null, false));
        body.append(tr);
      }
    };
    let sortKey = "avg", desc = true;
    for (const th of head.querySelectorAll("th.sortable")) th.addEventListener("click", () => {
      desc = th.dataset.sort === sortKey ? !desc : th.dataset.sort !== "method";
      sortKey = th.dataset.sort; draw(sortKey, desc);
    });
    draw(sortKey, desc);
    t.append(body);
    box.append(el("h3", {}, table.model + " · " + table.task + " · question-" + table.question_mode));
    for (const w of table.warnings) box.append(el("p", {class: "warning"}, "⚠ " + w));
    if (!table.full) box.append(el("p", {class: "muted"}, "no full-cache run: no difference to the full cache"));
    box.append(t);
  }
  if (!box.children.length) box.append(el("p", {class: "muted"}, "no run matches the filters"));
}

function renderPredictions(runs) {
  const box = document.getElementById("predictions");
  box.replaceChildren();
  const withRows = runs.filter(r => DATA.predictions[r.run_id]);
  if (!withRows.length) { box.append(el("p", {class: "muted"}, "no predictions.jsonl in the runs shown")); return; }
  const datasets = [...new Set(withRows.flatMap(r => Object.keys(DATA.predictions[r.run_id])))].sort();
  const dsSelect = el("select", {id: "pred-dataset"});
  for (const d of datasets) dsSelect.append(el("option", {value: d}, d));
  const runSelect = el("select", {id: "pred-run"});
  const order = [...withRows].sort((a, b) => (a.method === "full") - (b.method === "full") || label(a).localeCompare(label(b)) || (a.x || 0) - (b.x || 0));
  for (const r of order) runSelect.append(el("option", {value: r.run_id}, label(r) + " · " + r.budget));
  const onlyWrong = el("input", {type: "checkbox", id: "pred-failures"});
  const out = el("div", {});
  const draw = () => {
    out.replaceChildren();
    const rows = ((DATA.predictions[runSelect.value] || {})[dsSelect.value] || [])
      .filter(p => !onlyWrong.checked || (p.score !== null && p.score < 100));
    const t = el("table", {class: "preds"}, el("tr", {}, ...["id", "prompt (end)", "prediction", "answer", "score"].map(h => el("th", {}, h))));
    for (const p of rows) t.append(el("tr", {class: "pred-row"}, el("td", {}, p.id), el("td", {class: "muted"}, p.prompt_end ? "…" + p.prompt_end : "–"),
      el("td", {class: "prediction"}, p.prediction), el("td", {}, p.answers.join(" | ")), el("td", {}, fmt(p.score, 1))));
    out.append(rows.length ? t : el("p", {class: "muted"}, "no prediction"));
  };
  for (const s of [dsSelect, runSelect, onlyWrong]) s.addEventListener("change", draw);
  box.append(el("label", {}, "dataset ", dsSelect), " ", el("label", {}, "run ", runSelect), " ",
    el("label", {}, onlyWrong, " only samples scored below 100"),
    el("p", {class: "muted"}, "the first " + DATA.browser_rows + " samples of each dataset"), out);
  draw();
}

function renderBreakdowns() {
  const box = document.getElementById("breakdowns");
  box.replaceChildren();
  for (const table of DATA.breakdowns) {
    if (!shown(table, ["model", "task"])) continue;
    const rows = table.rows.filter(r => !state.question_mode || r.question_mode === state.question_mode);
    if (!rows.length) continue;
    const t = el("table", {class: "breakdown", "data-model": table.model, "data-task": table.task, "data-dataset": table.dataset},
      el("tr", {}, ...["method", "budget", "mode", "score"].map(h => el("th", {}, h)),
        ...table.columns.map(c => el("th", {"data-column": c.key}, c.label))));
    for (const r of rows) {
      t.append(el("tr", {class: "breakdown-row", "data-run-id": r.run_id},
        el("td", {class: "key"}, el("span", {class: "swatch", style: "background:" + r.colour}), r.label),
        el("td", {}, r.budget), el("td", {}, r.question_mode), el("td", {}, el("b", {}, fmt(r.score, 1))),
        ...table.columns.map(c => el("td", {class: "bd-cell", "data-column": c.key,
          "data-value": r.values[c.key] === null || r.values[c.key] === undefined ? "" : String(r.values[c.key])}, fmt(r.values[c.key], 1)))));
    }
    box.append(el("h3", {}, table.model + " · " + table.task + " · " + table.dataset), t);
  }
  if (!box.children.length) box.append(el("p", {class: "muted"}, "no run shown has sub-scores beside its headline"));
}

function renderLengthPlots() {
  const box = document.getElementById("length-plots");
  box.replaceChildren();
  for (const chart of DATA.length_charts) {
    if (!shown(chart, ["model", "task"])) continue;
    const series = chart.series.filter(s => !state.question_mode || s.question_mode === state.question_mode);
    if (!series.length) continue;
    const traces = series.map(s => ({type: "scatter", mode: s.method === "full" ? "markers" : "lines+markers", name: s.label,
      x: s.points.map(p => p.x), y: s.points.map(p => p.y), text: s.points.map(p => p.budget),
      line: {color: s.colour}, marker: {color: s.method === "full" ? "black" : s.colour, size: s.method === "full" ? 11 : 7, symbol: s.method === "full" ? "star" : "circle"},
      hovertemplate: "%{text}: %{x:.0f} tokens generated, accuracy %{y:.1f}<extra>" + s.label + "</extra>"}));
    const div = el("div", {class: "plot length-plot", "data-model": chart.model, "data-task": chart.task, "data-dataset": chart.dataset});
    box.append(div);
    Plotly.newPlot(div, traces, {title: {text: chart.model + " · " + chart.dataset + " · accuracy vs generated length", font: {size: 13}},
      margin: {t: 40, r: 10, b: 40}, legend: {font: {size: 10}, orientation: "h", y: -0.25},
      xaxis: {title: {text: "mean generated tokens per sample (new_tokens)"}, rangemode: "nonnegative"},
      yaxis: {title: {text: "accuracy"}, rangemode: "nonnegative"}},
      {displaylogo: false, displayModeBar: false, responsive: true});
  }
  if (!box.children.length) box.append(el("p", {class: "muted"}, "no long-reasoning run shown records generated lengths"));
}
"""
