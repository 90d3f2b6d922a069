// The streamlearn dashboard: polls /v1/dashboard once a second, draws its charts as SVG,
// and explains a query through /v1/explain. No library, nothing from the internet.
(function () {
  "use strict";

  const POLL_MS = 1000;
  const ROLL_EXAMPLES = 300; // the prequential chart's rolling window, in evaluated answers
  const GAP_S = 5; // an idle worker adds no point: a wider gap between two points breaks a line drawn over time
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2563eb", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#0ea5e9", "#d946ef", "#84cc16"];

  const state = { commits: null, points: [], card: null, axis: "records", task: null, lastPoll: 0, quiet: false };

  // ---------------------------------------------------------------- formatting
  function num(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    if (digits !== undefined) return v.toFixed(digits);
    return a >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toPrecision(3);
  }
  function seconds(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }
  function bytes(n) {
    const units = ["B", "KB", "MB", "GB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + " " + units[i];
  }
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svgEl(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function setTile(id, value) { document.querySelector("#" + id + " .value").textContent = value; }

  // ---------------------------------------------------------------- charts
  function niceTicks(lo, hi, n, minStep) {
    if (!(hi > lo)) { hi = lo + 1; }
    const raw = Math.max((hi - lo) / n, minStep || 0), mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  // series: [{name, color, points: [[x, y, gap]], dots}] (gap: an idle stretch before the point, where a line
  // over time breaks); opts: {x: "time"|"records", yFormat, yMin, yMax, markers}
  function drawChart(svg, series, opts) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const W = svg.clientWidth || 600, H = svg.clientHeight || 200;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    const pts = series.flatMap(s => s.points).filter(p => isFinite(p[0]) && isFinite(p[1]));
    svg.dataset.points = String(pts.length);
    if (!pts.length) {
      const t = svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" });
      t.textContent = opts.empty || "no data yet: the history arrives with the worker's checkpoints";
      svg.appendChild(t);
      delete svg.dataset.lastX;
      return;
    }
    const L = 52, R = 12, B = 34;
    const T = 10 + 14 * legend(svg, series, L, W - R);
    const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    let y0 = opts.yMin !== undefined ? opts.yMin : Math.min(0, ...ys);
    let y1 = opts.yMax !== undefined ? opts.yMax : Math.max(...ys);
    if (y1 <= y0) y1 = y0 + 1;
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    for (const v of niceTicks(y0, y1, 4)) {
      svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), class: "grid" }));
      const t = svgEl("text", { x: L - 6, y: sy(v) + 4, "text-anchor": "end" });
      t.textContent = (opts.yFormat || num)(v);
      svg.appendChild(t);
    }
    const xfmt = opts.x === "time" ? clock : v => num(v);
    for (const v of niceTicks(x0, x1, opts.x === "time" ? 4 : 5, opts.x === "time" ? 1 : 0)) {
      const edge = sx(v) > W - R - 30 ? "end" : "middle"; // the last label stays inside the chart
      const t = svgEl("text", { x: sx(v), y: H - B + 16, "text-anchor": edge });
      t.textContent = xfmt(v);
      svg.appendChild(t);
    }
    const xl = svgEl("text", { x: W - R, y: H - 4, "text-anchor": "end" });
    xl.textContent = opts.x === "time" ? "time" : "stream position (records)";
    svg.appendChild(xl);
    svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    for (const m of opts.markers || []) {
      if (m >= x0 && m <= x1) {
        svg.appendChild(svgEl("line", { x1: sx(m), x2: sx(m), y1: T, y2: H - B, class: "restart" }));
      }
    }
    series.forEach((s, i) => {
      const good = s.points.filter(p => isFinite(p[0]) && isFinite(p[1]));
      if (!good.length) return;
      const color = s.color || PALETTE[i % PALETTE.length];
      if (good.length > 1 && !s.dotsOnly) {
        const breaks = opts.x === "time";
        const d = good.map((p, j) => (j && !(breaks && p[2]) ? "L" : "M") + sx(p[0]).toFixed(1) + " "
                                     + sy(p[1]).toFixed(1)).join("");
        svg.appendChild(svgEl("path", { d: d, class: "series", stroke: color, "data-series": s.name }));
      }
      if (s.dots || good.length === 1 || s.dotsOnly) {
        for (const p of good) svg.appendChild(svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: color }));
      }
    });
    svg.dataset.lastX = String(x1);
  }

  // The series' names above the plot, each after the last, wrapping to a new row where the
  // width ends; the number of rows.
  function legend(svg, series, left, right) {
    let x = left, row = 0;
    series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      const text = svgEl("text", { x: 0, y: 0, class: "legend", "data-series": s.name });
      text.textContent = s.name;
      svg.appendChild(text);
      const width = text.getComputedTextLength() || 7 * s.name.length;
      if (x > left && x + 14 + width > right) { x = left; row++; }
      text.setAttribute("x", x + 14);
      text.setAttribute("y", 13 + 14 * row);
      svg.appendChild(svgEl("rect", { x: x, y: 4 + 14 * row, width: 10, height: 10, fill: color }));
      x += 14 + width + 18;
    });
    return series.length ? row + 1 : 0;
  }

  // ---------------------------------------------------------------- series from the points
  function xOf(p) { return state.axis === "time" ? p.t : p.records; }

  // Marks each point that follows an idle stretch (its window began more than GAP_S after
  // the previous point ended): lines over time break there instead of inventing a trend.
  function markGaps(points) {
    points.forEach((p, i) => { p.gap = i > 0 && p.t - (p.dt || 0) - points[i - 1].t > GAP_S; });
  }
  function at(p, y) { return [p.t, y, p.gap]; }

  // The worker checkpoints every worker.checkpoint_seconds while it has records; twice that
  // (and then some) without one means it is idle (caught up) or stopped.
  function quietAfter() {
    const every = state.card && state.card.config ? state.card.config["worker.checkpoint_seconds"] : null;
    return every > 0 ? 2 * every + 10 : 120;
  }

  function rolling(points) {
    // Per point with evaluated answers: the model's and the baseline's score over the last
    // ROLL_EXAMPLES answers (at least), so a point of a few answers does not jump around.
    const model = [], base = [];
    let meta = null;
    for (let i = 0; i < points.length; i++) {
      const e = points[i].eval;
      if (!e || !e.n) continue;
      meta = e;
      let n = 0, m = 0, b = 0;
      for (let j = i; j >= 0 && n < ROLL_EXAMPLES; j--) {
        const f = points[j].eval;
        if (!f || !f.n || f.metric !== e.metric) continue;
        n += f.n; m += f.model; b += f.base;
      }
      model.push([xOf(points[i]), m / n]);
      base.push([xOf(points[i]), b / n]);
    }
    return { model: model, base: base, meta: meta };
  }

  function floorTo(points, step) {
    // An accuracy axis from just below the lowest value (a step of 5%) to 100%.
    const ys = points.map(p => p[1]).filter(isFinite);
    return ys.length ? Math.max(0, Math.floor((Math.min(...ys) - step / 2) / step) * step) : 0;
  }

  function drawCharts() {
    const pts = state.points;
    const markers = pts.filter(p => p.start).map(xOf);
    const q = rolling(pts);
    const accuracy = q.meta && q.meta.metric === "accuracy";
    document.getElementById("quality-note").textContent = q.meta
      ? (accuracy ? "prequential accuracy (each answer predicted before it is learned), rolling over the last "
                    + ROLL_EXAMPLES + " evaluated answers; higher is better"
                  : "prequential loss (nats per answer, in the model's output code, before each step), rolling over the last "
                    + ROLL_EXAMPLES + " answers; lower is better")
        + ". Baseline: " + q.meta.baseline + ". Dashed lines: worker restarts."
      : "";
    drawChart(document.getElementById("chart-quality"), [
      { name: "model", color: "#2563eb", points: q.model },
      { name: q.meta ? q.meta.baseline : "baseline", color: "#f59e0b", points: q.base },
    ], { x: state.axis, markers: markers, yMin: accuracy ? floorTo(q.model.concat(q.base), 0.05) : undefined,
         yMax: accuracy ? 1 : undefined,
         yFormat: accuracy ? v => (v * 100).toFixed(0) + "%" : v => num(v) });

    const timeMarkers = pts.filter(p => p.start).map(p => p.t);
    drawChart(document.getElementById("chart-rate"),
      [{ name: "records/s", points: pts.filter(p => p.dt > 0).map(p => at(p, p.consumed / p.dt)) }],
      { x: "time", markers: timeMarkers });
    const parts = [...new Set(pts.flatMap(p => Object.keys(p.lag || {})))].sort((a, b) => a - b);
    drawChart(document.getElementById("chart-lag"),
      parts.map(k => ({ name: "partition " + k, points: pts.filter(p => p.lag && k in p.lag).map(p => at(p, p.lag[k])) })),
      { x: "time", markers: timeMarkers, empty: "no lag known yet" });
    drawChart(document.getElementById("chart-ckpt"),
      [{ name: "seconds", color: "#8b5cf6", dots: true,
         points: pts.filter(p => p.ckpt && p.ckpt.n).map(p => at(p, p.ckpt.max)) }],
      { x: "time", markers: timeMarkers, yFormat: v => num(v, 2),
        empty: "no checkpoint duration yet: each checkpoint's is committed with the next" });
    const reasons = [...new Set(pts.flatMap(p => Object.keys(p.dead || {})))].sort();
    drawChart(document.getElementById("chart-dead"), reasons.map(r => {
      let total = 0;
      return { name: r, points: pts.map(p => { total += (p.dead || {})[r] || 0; return at(p, total); }) };
    }), { x: "time", markers: timeMarkers, empty: "no dead letters: every record was valid" });
    drawChart(document.getElementById("chart-loss"),
      [{ name: "loss", color: "#0ea5e9", points: pts.filter(p => p.loss_n).map(p => at(p, p.loss_sum / p.loss_n)) }],
      { x: "time", markers: timeMarkers });

    const last = pts.length ? pts[pts.length - 1] : null;
    if (last) {
      const recent = pts.slice(-5).filter(p => p.dt > 0 && last.t - p.t <= 5 * GAP_S);
      const dt = recent.reduce((a, p) => a + p.dt, 0), n = recent.reduce((a, p) => a + p.consumed, 0);
      setTile("tile-rate", state.quiet ? "0" : dt ? num(n / dt) : "–");
      document.querySelector("#tile-rate .label").textContent = state.quiet ? "records/s (quiet)" : "records/s";
      setTile("tile-position", num(last.records));
      const lag = Object.values(last.lag || {});
      setTile("tile-lag", lag.length ? num(lag.reduce((a, b) => a + b, 0)) : "–");
    }
    if (q.model.length) {
      const m = q.model[q.model.length - 1][1], b = q.base[q.base.length - 1][1];
      document.getElementById("tile-quality-label").textContent = (accuracy ? "accuracy" : "loss") + ": model / " + q.meta.baseline;
      setTile("tile-quality", accuracy ? (m * 100).toFixed(1) + "% / " + (b * 100).toFixed(1) + "%" : num(m) + " / " + num(b));
    }
  }

  // ---------------------------------------------------------------- model card
  function drawCard(card) {
    if (!card) return;
    const config = document.getElementById("card-config");
    config.replaceChildren();
    for (const [k, v] of Object.entries(card.config || {})) { config.append(el("dt", {}, k), el("dd", {}, JSON.stringify(v))); }
    const changed = document.getElementById("card-changed");
    changed.replaceChildren();
    const entries = Object.entries(card.changed || {});
    if (!entries.length) changed.append(el("dt", {}, "none"), el("dd", {}, ""));
    for (const [k, v] of entries) { changed.append(el("dt", {}, k), el("dd", {}, JSON.stringify(v))); }
    const body = document.querySelector("#card-tables tbody");
    body.replaceChildren();
    for (const t of card.tables || []) {
      const tr = el("tr");
      const fill = t.rows ? t.stored / t.rows : 0;
      const bar = el("span", { class: "fillbar" }), inner = el("span");
      inner.style.width = (100 * Math.min(1, fill)).toFixed(1) + "%";
      bar.append(inner);
      const cell = el("td", { class: "num" });
      cell.append(bar, document.createTextNode((100 * fill).toFixed(1) + "% (" + num(t.stored) + ")"));
      tr.append(el("td", {}, t.name), el("td", { class: "num" }, num(t.rows) + " × " + t.width),
                el("td", { class: "num" }, bytes(t.bytes)), cell);
      body.append(tr);
    }
    document.getElementById("card-labels-count").textContent = card.labels_seen ? "(" + card.labels_seen + ")" : "";
    document.getElementById("card-labels").textContent = card.labels_seen
      ? card.labels.join(" · ") + (card.labels_seen > card.labels.length ? " …" : "")
      : (card.task === "classify" ? "none yet" : "none: task " + card.task + " answers with tokens");
  }

  // ---------------------------------------------------------------- polling
  async function poll() {
    const url = "/v1/dashboard" + (state.commits === null ? "" : "?since=" + state.commits);
    try {
      const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (r.status === 401) { location.reload(); return; }
      if (!r.ok) throw new Error("HTTP " + r.status);
      const body = await r.json();
      state.lastPoll = Date.now();
      setTile("tile-step", num(body.snapshot_step));
      setTile("tile-fresh", seconds(body.freshness_seconds));
      const totals = body.totals || {};
      setTile("tile-ckpt", seconds(totals.checkpoint_seconds));
      setTile("tile-dead", num(totals.dead_letters || 0));
      if (!body.unchanged) state.card = body.card;
      const status = document.getElementById("status");
      const quiet = body.freshness_seconds !== null && body.freshness_seconds > quietAfter();
      status.dataset.state = quiet ? "stale" : "live";
      status.textContent = (quiet ? "no checkpoint for " + seconds(body.freshness_seconds)
                                    + ": the worker is caught up, or stopped" : "live") + " · commit " + body.commits;
      const wasQuiet = state.quiet;
      state.quiet = quiet;
      if (!body.unchanged) {
        state.commits = body.commits;
        state.points = body.points || [];
        markGaps(state.points);
        if (body.card && body.card.task !== state.task) { state.task = body.card.task; adaptTryIt(); }
        document.getElementById("task").textContent = body.card ? "task " + body.card.task : "";
        drawCard(body.card);
        drawCharts();
      } else if (quiet !== wasQuiet) {
        drawCharts();
      }
    } catch (err) {
      const status = document.getElementById("status");
      status.dataset.state = "down";
      status.textContent = "cannot reach the service (" + err.message + ")";
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  // ---------------------------------------------------------------- try it
  function adaptTryIt() {
    const text = document.getElementById("tryit-text"), kind = document.getElementById("tryit-kind");
    const hints = {
      "classify": "type a text, then Explain (Ctrl+Enter)",
      "mlm": "a text with [MASK] where a word is missing (one is appended otherwise)",
      "next-item": "a key (read as: key) or item ids separated by spaces (read as: tokens)",
      "next-token": "the start of a text: which token comes next?",
    };
    text.placeholder = hints[state.task] || hints.classify;
    kind.querySelector("option[value=key]").disabled = state.task !== "next-item";
    if (state.task === "next-item" && kind.value === "text") kind.value = "tokens";
  }

  function contributionColor(c, scale) {
    if (c === null || c === undefined || !scale) return "";
    const a = Math.min(1, Math.abs(c) / scale) * 0.85 + 0.05;
    return "rgba(var(" + (c >= 0 ? "--pos" : "--neg") + "), " + a.toFixed(3) + ")";
  }

  function showExplanation(body) {
    const out = document.getElementById("tryit-result");
    out.hidden = false;
    const top = body.top || [];
    const valueName = state.task === "classify" ? "probability" : "log-probability";
    const best = top.length ? top[0] : null;
    document.getElementById("tryit-answer").textContent = best
      ? "→ " + best.output + " (" + valueName + " " + num(best.value, 3) + ")"
      : "→ nothing learned to answer with yet";
    document.getElementById("tryit-step").textContent = "snapshot step " + body.snapshot_step;
    document.getElementById("tryit-output-name").textContent = body.output === null ? "–" : String(body.output);
    const methods = Object.entries(body.methods || {}).map(([p, m]) => p.replace("_", " ") + ": " + m);
    document.getElementById("tryit-method").textContent = methods.length
      ? "contributions to " + (state.task === "classify" ? "its logit (centered)" : "its score") + "; " + methods.join(", ")
      : "";
    const contributions = body.contributions || [];
    const scale = Math.max(1e-9, ...contributions.filter(c => c !== null).map(Math.abs));
    const tokens = document.getElementById("tryit-tokens");
    tokens.replaceChildren();
    body.tokens.forEach((t, i) => {
      const c = contributions[i];
      const span = el("span", { class: "tok" + (c === null || c === undefined ? " none" : ""), "data-contribution": c === null ? "" : String(c) }, t);
      span.style.background = contributionColor(c, scale);
      span.title = c === null || c === undefined ? "the position asked about" : "contribution " + num(c, 4);
      tokens.append(span);
    });
    const bars = document.getElementById("tryit-top");
    bars.replaceChildren();
    const vals = top.map(x => x.value).filter(v => v !== null);
    const lo = Math.min(0, ...vals), hi = Math.max(...vals, 0);
    for (const x of top) {
      const row = el("div", { class: "bar" }), fill = el("div", { class: "fill" });
      const frac = state.task === "classify" ? (x.value || 0) : (hi > lo ? ((x.value || lo) - lo) / (hi - lo) : 1);
      fill.style.width = (100 * Math.max(0.02, frac)).toFixed(1) + "%";
      row.append(el("span", {}, String(x.output)), fill, el("span", { class: "num" }, num(x.value, 3)));
      bars.append(row);
    }
    const tbody = document.querySelector("#tryit-table tbody");
    tbody.replaceChildren();
    body.tokens.forEach((t, i) => {
      const tr = el("tr");
      const parts = Object.entries(body.parts || {}).map(([p, v]) => p.replace("_", " ") + " " + num(v[i], 3)).join(", ");
      const pw = el("td");
      const w = body.importance ? body.importance[i] : null;
      if (w) {
        const bar = el("span", { class: "pw" });
        for (const v of w) { const s = el("span"); s.style.height = Math.min(16, Math.abs(v || 0) * 16).toFixed(1) + "px"; bar.append(s); }
        pw.append(bar, document.createTextNode(" " + w.map(v => num(v, 3)).join(", ") + "  rows " + body.rows[i].join(", ")));
      } else {
        pw.textContent = body.importance ? "– (not read: the model reads the last hashing.max_tokens)"
          : "– (this embedding scheme learns no importance weights)";
      }
      tr.append(el("td", {}, t), el("td", { class: "num" }, num(contributions[i], 4)), el("td", {}, parts), pw);
      tbody.append(tr);
    });
  }

  async function explain(ev) {
    ev.preventDefault();
    const text = document.getElementById("tryit-text").value.trim();
    const kind = document.getElementById("tryit-kind").value;
    const output = document.getElementById("tryit-output").value.trim();
    const error = document.getElementById("tryit-error");
    const fail = message => {  // the last answer goes: it would read as this query's
      document.getElementById("tryit-result").hidden = true;
      error.textContent = message;
      error.hidden = false;
    };
    error.hidden = true;
    if (!text) { fail("type a text (or tokens, or a key) to explain"); return; }
    const query = { k: Math.max(1, Math.min(100, parseInt(document.getElementById("tryit-k").value, 10) || 5)) };
    if (kind === "text") query.text = text;
    else if (kind === "key") query.key = text;
    else query.tokens = text.split(/\s+/);
    if (output) query.output = output;
    try {
      const r = await fetch("/v1/explain", { method: "POST", credentials: "same-origin",
        headers: { "content-type": "application/json" }, body: JSON.stringify(query) });
      const body = await r.json();
      if (!r.ok) throw new Error(typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || body));
      showExplanation(body);
    } catch (err) {
      fail("could not explain: " + err.message);
    }
  }

  // ---------------------------------------------------------------- wiring
  document.getElementById("tryit-form").addEventListener("submit", explain);
  document.getElementById("tryit-text").addEventListener("keydown", ev => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) explain(ev);
  });
  for (const b of document.querySelectorAll(".toggle button")) {
    b.addEventListener("click", () => {
      state.axis = b.dataset.axis;
      for (const o of document.querySelectorAll(".toggle button")) o.classList.toggle("on", o === b);
      drawCharts();
    });
  }
  window.addEventListener("resize", () => drawCharts());
  window.streamlearnDashboard = { drawChart: drawChart }; // for tests/test_dashboard_browser.py
  poll();
})();
