// et ui: the page. Every text from runs, metrics and config goes into the DOM as text
// (text nodes, never parsed as HTML) and into Plotly (which renders a subset of HTML in titles,
// legends and hover text) with <, > and & escaped.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
let pollTimer = null;
let page = 0; // bumped on every navigation: late answers of a left page are dropped

// ------------------------------------------------------------------------- helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k === "on") for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
    else if (k in e && typeof v !== "string") e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
  return e;
}

// text for Plotly: it renders <b>, <br>, entities... in titles, names and hover text
function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    if (Array.isArray(v)) v.forEach((x) => u.append(k, x));
    else u.append(k, v);
  }
  return u.toString();
}

async function api(path, params) {
  const r = await fetch(`/api/${path}?${qs(params || {})}`);
  const body = await r.json();
  if (!r.ok) { const e = new Error(body.error || `HTTP ${r.status}`); e.status = r.status; throw e; }
  return body;
}

function fmtDuration(s) {
  if (s === null || s === undefined) return "";
  s = Math.max(0, s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(sec).padStart(2, "0")}s` : `${(s).toFixed(1)}s`;
}

// a run resumed under its name has several attempts: its whole life is shown (first start,
// wall duration from it to the latest end, active time summed over the attempts); the
// latest attempt's start and duration only where no run.json has the whole life
function firstStartOf(r) { return r.first_started_at ?? r.started_at; }
function wallOf(r) { return r.wall_duration_s ?? r.duration_s; }

function fmtTime(t) {
  if (t === null || t === undefined) return "";
  return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19);
}

function fmtValue(v) {
  if (v === null) return "null";
  if (typeof v === "object") return JSON.stringify(v);
  if (typeof v === "number" && !Number.isInteger(v)) return String(Number(v.toPrecision(6)));
  return String(v);
}

function main() { return document.getElementById("main"); }

function setMain(...children) {
  main().replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}

function showError(err) {
  setMain(el("p", { class: "error" }, String(err.message || err)));
}

// a run the server could not read (permissions, a FIFO, a damaged file) says why
function statusCell(st, error) {
  return el("td", { class: `status-${st}`, title: error || undefined }, st,
    error ? el("div", { class: "why" }, error) : null);
}

function stopPolling() {
  if (pollTimer) clearTimeout(pollTimer);
  pollTimer = null;
  document.getElementById("live").textContent = "";
}

// ------------------------------------------------------------------------- router

function route() {
  stopPolling();
  page += 1;
  window.scrollTo(0, 0);
  const h = location.hash.replace(/^#/, "") || "/";
  const [path, query] = h.split("?");
  const params = new URLSearchParams(query || "");
  if (path === "/run") return runPage(params.get("run"), page, params);
  if (path === "/compare") return comparePage(params.getAll("run"), page, params);
  if (path === "/groups") return groupsPage(params, page);
  if (path === "/sweep") return sweepPage(params, page);
  return runsPage(page, params);
}

function runLink(run) { return "#/run?" + qs({ run }); }

// ------------------------------------------------------------------------- runs page

const runsState = { text: "", status: "", tag: "", group: "", selected: new Set() };
// the built-in columns of the table: header -> the name a sort or filter uses (as et runs)
const BUILTIN_COLUMNS = [["run", "run"], ["status", "status"], ["steps", "steps"],
  ["duration", "duration"], ["active", "active"], ["started", "started"]];

// the table's choice (columns, order, filter, archived), kept in the URL:
// #/?columns=lr,summary.loss&sort=-summary.loss&where=lr%20%3E%201e-3&archived=1
function tableChoice(params) {
  return { columns: params.get("columns"), sort: params.get("sort") || "",
    where: params.get("where") || "", archived: params.get("archived") === "1" };
}

function setTableChoice(choice) {
  const p = {};
  if (choice.columns !== null && choice.columns !== undefined) p.columns = choice.columns;
  if (choice.sort) p.sort = choice.sort;
  if (choice.where) p.where = choice.where;
  if (choice.archived) p.archived = "1";
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(p)) u.append(k, v);
  const s = u.toString();
  location.hash = s ? "#/?" + s : "#/";
}

// the answer for the choice; a choice the server refuses (a filter that does not parse, a
// column no run has) is shown with why, and the runs without it
async function fetchRuns(choice) {
  const q = { sort: choice.sort, where: choice.where, archived: choice.archived ? "1" : "" };
  if (choice.columns !== null && choice.columns !== undefined) q.columns = choice.columns;
  try {
    return { data: await api("runs", q), problem: null };
  } catch (e) {
    if (e.status !== 400) throw e;
    return { data: await api("runs", { archived: q.archived }), problem: String(e.message) };
  }
}

// et ui s3://...: a refresh of the bucket's copy that failed (the copy is shown as it was)
// or runs of the bucket not copied, from /api/runs; "" when all is well
function refreshNote(d) {
  if (d.refresh_error) return `The bucket could not be read; showing the copy as it was: ${d.refresh_error}`;
  const p = d.refresh_problems || [];
  if (!p.length) return "";
  return `${p.length} producer${p.length > 1 ? "s" : ""} of the bucket not copied: ${p.slice(0, 3).join("; ")}${p.length > 3 ? "; …" : ""}`;
}

async function runsPage(me, params) {
  const choice = tableChoice(params || new URLSearchParams());
  let data, problem;
  try { ({ data, problem } = await fetchRuns(choice)); } catch (e) { return showError(e); }
  if (me !== page) return;
  document.getElementById("root").textContent = data.root;
  let runs = data.runs;
  const uniq = (xs) => [...new Set(xs)].sort();
  // the choices of each filter, from the runs as they are now (plus the one chosen)
  const choices = {
    status: () => uniq(runs.map((r) => r.status)),
    tag: () => uniq(runs.flatMap((r) => r.tags)),
    group: () => uniq(runs.map((r) => r.group).filter((g) => g)),
  };
  const options = (key) => {
    const values = choices[key]();
    if (runsState[key] && !values.includes(runsState[key])) values.push(runsState[key]);
    return [el("option", { value: "" }, "all"),
      ...values.map((v) => el("option", { value: v, selected: runsState[key] === v }, v))];
  };
  const selects = {};
  const select = (key, label) => el("label", {}, label + " ",
    selects[key] = el("select", { id: `filter-${key}`, on: { change: (e) => { runsState[key] = e.target.value; draw(); } } },
      options(key)));
  const compareBtn = el("button", { id: "compare", on: { click: () => {
    location.hash = "#/compare?" + qs({ run: [...runsState.selected] });
  } } }, "Compare selected");
  const tbody = el("tbody", { id: "runs-body" });
  const thead = el("thead", {});
  const count = el("span", { class: "muted", id: "runs-count" });
  const banner = el("p", { class: "error", id: "refresh-banner", role: "status" });
  const keyList = el("datalist", { id: "column-keys" });
  const whereInput = el("input", { id: "filter-where", type: "search", size: 36, list: "column-keys",
    placeholder: "filter: lr > 1e-3 and status = failed", value: choice.where,
    on: { keydown: (e) => { if (e.key === "Enter") setTableChoice({ ...choice, where: e.target.value.trim() }); } } });
  const columnsInput = el("input", { id: "filter-columns", type: "search", size: 36, list: "column-keys",
    placeholder: "columns: lr, batch, summary.loss",
    value: choice.columns !== null ? choice.columns : data.labels.join(","),
    on: { keydown: (e) => { if (e.key === "Enter") setTableChoice({ ...choice, columns: e.target.value.replace(/\s+/g, "") }); } } });
  const archivedBox = el("input", { id: "filter-archived", type: "checkbox", checked: choice.archived,
    on: { change: (e) => setTableChoice({ ...choice, archived: e.target.checked }) } });
  setMain(
    el("h2", {}, "Runs"),
    el("div", { class: "filters" },
      el("input", { id: "filter-text", type: "search", placeholder: "filter by name, project, tag…",
        value: runsState.text, on: { input: (e) => { runsState.text = e.target.value; draw(); } } }),
      select("status", "status"), select("tag", "tag"), select("group", "group"),
      el("label", {}, archivedBox, ` archived${data.hidden ? ` (${data.hidden} hidden)` : ""}`),
      compareBtn, count),
    el("div", { class: "filters" }, whereInput, columnsInput, keyList,
      el("span", { class: "muted" }, "Enter applies; click a header to sort")),
    problem ? el("p", { class: "error", id: "table-problem" }, problem) : null,
    banner,
    el("table", { id: "runs" }, thead, tbody));

  // the order: click a header for ascending, again for descending, a third time for none
  const sorted = choice.sort.split(",")[0] || "";
  const sortCol = sorted.replace(/^-/, ""), sortDesc = sorted.startsWith("-");
  function header(label, column) {
    const mark = column === sortCol ? (sortDesc ? " ▼" : " ▲") : "";
    const next = column !== sortCol ? column : !sortDesc ? "-" + column : "";
    return el("th", { class: "sortable", "data-column": column, title: `sort by ${column}`,
      on: { click: () => setTableChoice({ ...choice, sort: next }) } }, label + mark);
  }
  function drawHead() {
    keyList.replaceChildren(...data.keys.map((k) => el("option", { value: k })));
    thead.replaceChildren(el("tr", {}, el("th", {}, ""),
      ...BUILTIN_COLUMNS.map(([label, column]) => header(label, column)),
      ...data.columns.map((c, i) => header(data.labels[i], c)),
      el("th", {}, "tags"), el("th", {}, "group")));
  }

  function visible(r) {
    const t = runsState.text.toLowerCase();
    if (t && ![r.run, r.project || "", r.name, r.group || "", ...r.tags].some((s) => s.toLowerCase().includes(t))) return false;
    if (runsState.status && r.status !== runsState.status) return false;
    if (runsState.tag && !r.tags.includes(runsState.tag)) return false;
    if (runsState.group && r.group !== runsState.group) return false;
    return true;
  }
  function draw() {
    const shown = runs.filter(visible);
    tbody.replaceChildren(...shown.map((r) => el("tr", { "data-run": r.run, class: r.archived ? "archived" : undefined },
      el("td", {}, el("input", { type: "checkbox", checked: runsState.selected.has(r.run), on: { change: (e) => {
        if (e.target.checked) runsState.selected.add(r.run); else runsState.selected.delete(r.run);
        compareBtn.disabled = runsState.selected.size < 2;
      } } })),
      el("td", {}, el("a", { href: runLink(r.run) }, r.run)),
      statusCell(r.status, r.error),
      el("td", { class: "num" }, r.steps ?? ""),
      el("td", { class: "num" }, fmtDuration(wallOf(r))),
      el("td", { class: "num" }, fmtDuration(r.active_duration_s)),
      el("td", {}, fmtTime(firstStartOf(r))),
      ...data.columns.map((c) => {
        const has = Object.prototype.hasOwnProperty.call(r.values, c);
        const v = r.values[c];
        return el("td", { class: typeof v === "number" ? "num value" : "value", "data-column": c },
          has ? fmtValue(v) : "");
      }),
      el("td", {}, r.tags.map((t) => el("span", { class: "tag" }, t))),
      el("td", {}, r.group || ""))));
    const hidden = data.total - data.hidden - runs.length;
    count.textContent = `${shown.length} of ${runs.length} runs` + (hidden > 0 ? ` (${hidden} filtered out)` : "");
    banner.textContent = refreshNote(data);
    banner.hidden = !banner.textContent;
    compareBtn.disabled = runsState.selected.size < 2;
  }
  drawHead();
  draw();
  // status and steps change while runs write: reload the rows now and then (the filters,
  // their focus and the selection stay)
  async function refresh() {
    if (me !== page) return;
    try {
      const fresh = (await fetchRuns(problem ? { columns: null, sort: "", where: "", archived: choice.archived } : choice)).data;
      if (me !== page) return;
      runs = fresh.runs;
      const headChanged = JSON.stringify(fresh.columns) !== JSON.stringify(data.columns);
      data = fresh;
      if (headChanged) drawHead();
      // a status, tag or group that appeared since (a sweep's runs finishing) can be chosen
      for (const [key, sel] of Object.entries(selects)) {
        if (document.activeElement !== sel) sel.replaceChildren(...options(key));
      }
      draw();
    } catch (e) { /* the next refresh tries again */ }
    if (me === page) pollTimer = setTimeout(refresh, 5000);
  }
  pollTimer = setTimeout(refresh, 5000);
}

// ------------------------------------------------------------------------- charts

// ------------------------------------------------------------------------- chart controls
// smoothing (computed by the server on the raw series: /api/series?smooth=ema:0.9|mean:20),
// log y and the x axis of the run and compare pages, kept in the page's address
// (#/run?run=A&smooth=ema:0.9&log=1&x=epoch&pin=train/loss,val/acc&baseline=B)

function chartOpts(params) {
  const smooth = params.get("smooth") || "";
  return { x: params.get("x") || "step", smooth: /^(ema|mean):/.test(smooth) ? smooth : "", log: params.get("log") === "1" };
}

// the page's address with these values (others kept); replaceState: no reload, no hashchange
function keepInUrl(values) {
  const h = location.hash.replace(/^#/, "") || "/";
  const [path, query] = h.split("?");
  const u = new URLSearchParams(query || "");
  for (const [k, v] of Object.entries(values)) { if (v === "" || v === null || v === false) u.delete(k); else u.set(k, v); }
  history.replaceState(null, "", "#" + path + (u.toString() ? "?" + u.toString() : ""));
}

// the controls: x axis (step, wall time, relative time, step metrics), smoothing kind and
// its weight or window, log y; onChange(what) is called with "x", "smooth" or "log"
function chartControls(opts, xOptions, onChange) {
  const [kind0, arg0] = opts.smooth ? opts.smooth.split(":") : ["", ""];
  const xSelect = el("select", { id: "x-axis", on: { change: (e) => { opts.x = e.target.value; keepInUrl({ x: opts.x === "step" ? "" : opts.x }); onChange("x"); } } },
    [["step", "step"], ["time", "wall time"], ["relative", "relative time"], ...xOptions.map((m) => [m, m])]
      .map(([v, t]) => el("option", { value: v, selected: v === opts.x }, t)));
  const kind = el("select", { id: "smooth-kind" },
    [["", "none"], ["ema", "EMA (debiased)"], ["mean", "running mean"]].map(([v, t]) => el("option", { value: v, selected: v === kind0 }, t)));
  const arg = el("input", { id: "smooth-arg", type: "number", size: 6, style: "width: 6em",
    value: arg0 || "0.9", step: kind0 === "mean" ? "1" : "0.01", min: kind0 === "mean" ? "1" : "0", max: kind0 === "mean" ? "" : "0.999" });
  const apply = () => {
    if (kind.value === "mean" && arg.step !== "1") { arg.step = "1"; arg.min = "1"; arg.max = ""; if (!(Number(arg.value) >= 1)) arg.value = "20"; }
    if (kind.value === "ema" && arg.step !== "0.01") { arg.step = "0.01"; arg.min = "0"; arg.max = "0.999"; if (!(Number(arg.value) < 1)) arg.value = "0.9"; }
    opts.smooth = kind.value ? `${kind.value}:${arg.value}` : "";
    keepInUrl({ smooth: opts.smooth });
    onChange("smooth");
  };
  kind.addEventListener("change", apply);
  arg.addEventListener("change", apply);
  const log = el("input", { id: "log-y", type: "checkbox", checked: opts.log, on: { change: (e) => { opts.log = e.target.checked; keepInUrl({ log: opts.log ? "1" : "" }); onChange("log"); } } });
  return el("div", { class: "controls", id: "chart-controls" },
    el("label", {}, "x axis ", xSelect),
    el("label", { title: "computed on every raw point; the raw series stays, faint" }, "smoothing ", kind, " ", arg),
    el("label", {}, log, " log y"));
}

function xOut(x, mode) { return mode === "time" ? new Date(x * 1000) : x; }
function xTitle(mode) { return mode === "step" || mode === "time" ? "" : mode === "relative" ? "seconds since the first row" : esc(mode); }

// a zoomed range back to x: Plotly shows a Date in the browser's local time and answers a
// date axis' range as local-time text ("2026-12-01 17:02:47.7719"), so it is read as local
// time (read as UTC, every zoom outside UTC asked for a range hours away: an empty chart)
function xIn(v, mode) {
  if (mode !== "time") return Number(v);
  if (typeof v === "number") return v / 1000;
  const m = /^(-?\d+)-(\d\d)-(\d\d)(?:[ T](\d\d)(?::(\d\d)(?::(\d\d(?:\.\d*)?))?)?)?$/.exec(String(v).trim());
  if (!m) return Date.parse(String(v)) / 1000;
  const sec = Number(m[6] || 0);
  const whole = new Date(Number(m[1]), Number(m[2]) - 1, Number(m[3]), Number(m[4] || 0), Number(m[5] || 0), Math.floor(sec));
  return whole.getTime() / 1000 + (sec - Math.floor(sec));
}

// the Plotly figure of one chart: per series the raw line (faint when smoothing), the EMA,
// non-finite points as marks on a second y axis (0..1: NaN mid, +inf top, -inf bottom),
// alert events as marks at the top with their message
// Zoom (drag) and zoom-out (double click) on a chart call load(chart) again with chart.range
// set to the x range shown (null: all), once per chart.
function hookZoom(chart, opts, load) {
  if (chart.hooked) return;
  chart.hooked = true;
  chart.div.on("plotly_relayout", (ev) => {
    if (ev["xaxis.autorange"]) { chart.range = null; load(chart); return; }
    const a = ev["xaxis.range[0]"] ?? (ev["xaxis.range"] || [])[0];
    const b = ev["xaxis.range[1]"] ?? (ev["xaxis.range"] || [])[1];
    if (a === undefined || b === undefined) return;
    chart.range = [xIn(a, opts.x), xIn(b, opts.x)];
    load(chart);
  });
}

function figure(chart, opts) {
  const traces = [];
  const nonfinite = { x: [], y: [], text: [] };
  chart.series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const smooth = !!s.smooth; // the server's smoothing of the raw series
    traces.push({
      type: "scatter", mode: s.x.length < 60 ? "lines+markers" : "lines",
      name: esc(s.label), x: s.x.map((x) => xOut(x, opts.x)), y: s.y,
      line: { color, width: smooth ? 1 : 1.5 }, marker: { size: 4 },
      opacity: smooth ? 0.25 : 1, connectgaps: false, showlegend: !smooth,
      meta: { role: "raw", series: s.label },
    });
    if (smooth) {
      traces.push({
        type: "scatter", mode: "lines", name: esc(s.label), x: s.smooth.x.map((x) => xOut(x, opts.x)),
        y: s.smooth.y, line: { color, width: 2 }, connectgaps: false, meta: { role: "smooth", series: s.label },
      });
    }
    for (const p of s.nonfinite) {
      nonfinite.x.push(xOut(p.x, opts.x));
      nonfinite.y.push(p.kind === "nan" ? 0.5 : p.kind === "inf" ? 0.97 : 0.03);
      nonfinite.text.push(esc(`${s.label}: ${p.kind === "nan" ? "NaN" : p.kind === "inf" ? "+inf" : "-inf"} at step ${p.step}`));
    }
  });
  if (nonfinite.x.length) {
    traces.push({ type: "scatter", mode: "markers", name: "NaN/±inf", x: nonfinite.x, y: nonfinite.y,
      yaxis: "y2", text: nonfinite.text, hoverinfo: "text",
      marker: { symbol: "x", size: 9, color: "#d62728" }, meta: { role: "nonfinite" } });
  }
  const alerts = (chart.alerts || []).filter((a) => a.x !== null && a.x !== undefined);
  if (alerts.length) {
    traces.push({ type: "scatter", mode: "markers", name: "alerts", yaxis: "y2",
      x: alerts.map((a) => xOut(a.x, opts.x)), y: alerts.map(() => 1.0),
      text: alerts.map((a) => esc(`${a.event || a.state || ""} ${a.rule || ""}: ${a.message || ""}`)),
      hoverinfo: "text",
      marker: { symbol: alerts.map((a) => (a.event === "resolved" || a.state === "ok") ? "triangle-up" : "triangle-down"),
        size: 11, color: alerts.map((a) => (a.event === "resolved" || a.state === "ok") ? "#2ca02c" : "#ff7f0e") },
      meta: { role: "alerts" } });
  }
  const layout = {
    title: { text: esc(chart.title), font: { size: 13 } },
    margin: { l: 50, r: 10, t: 30, b: 35 },
    showlegend: chart.series.length > 1 || nonfinite.x.length > 0 || alerts.length > 0,
    legend: { orientation: "h", y: -0.2, font: { size: 10 } },
    xaxis: { type: opts.x === "time" ? "date" : "linear", title: { text: xTitle(opts.x) } },
    yaxis: { type: opts.log ? "log" : "linear" },
    yaxis2: { overlaying: "y", range: [0, 1.02], visible: false, fixedrange: true },
    uirevision: chart.uirev,
  };
  if (chart.range) { layout.xaxis.range = chart.range.map((v) => xOut(v, opts.x)); layout.xaxis.autorange = false; }
  return { data: traces, layout };
}

// plotly.min.js loads async (the data is fetched meanwhile); charts wait for it
const plotlyReady = new Promise((resolve, reject) => {
  if (window.Plotly) return resolve();
  const tag = document.getElementById("plotly-js");
  tag.addEventListener("load", () => resolve());
  tag.addEventListener("error", () => reject(new Error("plotly.js did not load")));
});

async function draw(chart, opts) {
  await plotlyReady;
  const f = figure(chart, opts);
  return Plotly.react(chart.div, f.data, f.layout, { responsive: true, displaylogo: false });
}

function chartWidth(div) { return Math.max(100, Math.min(4000, Math.round(div.clientWidth || 560))); }

// ------------------------------------------------------------------------- run page sections

const SECTION_TITLES = { pinned: "Pinned", metrics: "", spans: "Span timings" };

// the run page's chart sections (the server's order: pinned, the user's metrics as first
// logged, span timings), each metric's charts grouped by the prefix before the first "/"
// in the order the groups first appear; returns metric -> the box its chart goes in (a
// metric first seen live goes to the span timings or the user's section)
function metricSections(chartsBox, sections) {
  const where = new Map(); // metric -> section name
  const boxes = new Map(); // section name -> { sec, groups: Map(prefix -> box) }
  const order = ["pinned", "metrics", "spans"];
  for (const s of sections) for (const m of s.metrics) where.set(m, s.name);
  function sectionBox(name) {
    if (boxes.has(name)) return boxes.get(name);
    const sec = el("section", { class: "metric-section", "data-section": name },
      SECTION_TITLES[name] ? el("h2", { class: "section-title" }, SECTION_TITLES[name]) : null);
    const next = order.slice(order.indexOf(name) + 1).map((n) => boxes.get(n)).find((b) => b);
    chartsBox.insertBefore(sec, next ? next.sec : null);
    const entry = { sec, groups: new Map() };
    boxes.set(name, entry);
    return entry;
  }
  function groupOf(m) { const i = m.indexOf("/"); return i > 0 ? m.slice(0, i) : ""; }
  return (metric) => {
    const name = where.get(metric) || (/^(time_ms|count)\//.test(metric) ? "spans" : "metrics");
    const entry = sectionBox(name);
    const g = name === "pinned" ? "pinned" : groupOf(metric);
    if (!entry.groups.has(g)) {
      const box = el("div", { class: "charts" });
      entry.sec.appendChild(el("section", { class: "group", "data-group": g },
        name === "pinned" ? null : el("h3", {}, g || "(no prefix)"), box));
      entry.groups.set(g, box);
    }
    return entry.groups.get(g);
  };
}

// the config: the keys that are not defaults (a Hydra job's: those its overrides set;
// "show defaults" shows all), and against a baseline run (?baseline=ID) its values beside
// them, the keys that differ highlighted ("only differences" hides the others)
function configBox(d, run) {
  const v = d.config_view;
  const state = { defaults: !v.defaults_known, same: !v.baseline };
  const body = el("tbody");
  const head = el("thead", {}, el("tr", {}, el("th", {}, "key"), el("th", {}, "value"),
    v.baseline ? el("th", {}, `baseline ${v.baseline_run}`) : null));
  const rows = [...v.rows, ...v.only_in_baseline.map((r) => ({ key: r.key, missing: true, default: null, baseline: r.baseline, in_baseline: true, differs: true }))];
  const count = el("span", { class: "muted", id: "config-hidden" });
  function draw() {
    const shown = rows.filter((r) => (state.defaults || r.default !== true) && (state.same || r.differs));
    body.replaceChildren(...shown.map((r) => el("tr", { class: r.differs ? "differs" : r.default ? "default" : undefined, "data-key": r.key },
      el("td", {}, r.key), el("td", {}, r.missing ? "—" : fmtValue(r.value)),
      v.baseline ? el("td", {}, r.in_baseline ? fmtValue(r.baseline) : "—") : null)));
    const hidden = rows.length - shown.length;
    count.textContent = hidden ? `${hidden} hidden` : "";
  }
  const runsList = el("datalist", { id: "baseline-runs" });
  const baseline = el("input", { id: "config-baseline", type: "search", size: 20, list: "baseline-runs",
    placeholder: "baseline run…", value: v.baseline_run || "",
    on: { focus: async () => {
      if (runsList.childElementCount) return;
      try { const r = await api("runs", {}); runsList.replaceChildren(...r.runs.filter((x) => x.run !== run).map((x) => el("option", { value: x.run }))); } catch (e) { /* typed by hand */ }
    }, keydown: (e) => {
      if (e.key !== "Enter") return;
      keepInUrl({ baseline: e.target.value.trim() });
      route(); // the page again, with the baseline's differences
    } } });
  const toggles = el("div", { class: "controls" },
    v.defaults_known ? el("label", {}, el("input", { type: "checkbox", id: "config-defaults", checked: state.defaults,
      on: { change: (e) => { state.defaults = e.target.checked; draw(); } } }), " show defaults") : null,
    v.baseline ? el("label", {}, el("input", { type: "checkbox", id: "config-same", checked: state.same,
      on: { change: (e) => { state.same = e.target.checked; draw(); } } }), " show equal keys") : null,
    baseline, runsList, count);
  draw();
  return el("div", {}, el("h3", {}, "Config"), toggles,
    v.defaults_known ? null : el("p", { class: "muted" }, "defaults unknown (not a Hydra job): every key shown"),
    rows.length ? el("table", { id: "config" }, head, body) : el("p", { class: "muted" }, "none"));
}

// ------------------------------------------------------------------------- run page

async function runPage(run, me, params) {
  if (!run) return showError("no run given");
  let d;
  try { d = await api("run", { run, pin: params.get("pin"), baseline: params.get("baseline") }); } catch (e) { return showError(e); }
  if (me !== page) return;
  const opts = chartOpts(params);
  const charts = new Map(); // metric -> chart
  // the system sampler's producers have their own section (docs/system.md)
  const multi = d.producers.filter((p) => p !== "system" && !p.startsWith("system/")).length > 1;
  let maxStep = d.steps === null ? -1 : d.steps - 1;
  // live polling asks each producer (rank, stream) from its own last step: a rank that lags
  // the others, or a stream that stopped, loses nothing; one step is asked again (a metric
  // logged later at the same step), the series keep only steps they do not have yet
  let lastBy = { ...(d.producer_steps || {}) };

  const statusEl = el("span", { id: "run-status", class: `status-${d.status}` }, d.status);
  const stepsEl = el("span", { id: "run-steps" }, d.steps ?? 0);
  const controls = chartControls(opts, d.x_options, (what) => (what === "log" ? redrawAll() : reloadAll()));
  const chartsBox = el("div", { id: "charts" });
  const place = metricSections(chartsBox, d.sections);
  function addChart(metric) {
    if (charts.has(metric)) return charts.get(metric);
    const div = el("div", { class: "chart", "data-metric": metric });
    place(metric).appendChild(div);
    const chart = { metric, title: metric, div, series: [], range: null, uirev: 1, alerts: [] };
    charts.set(metric, chart);
    return chart;
  }

  function alertsFor(metric) {
    const mine = d.alerts.filter((a) => a.metrics.includes(metric));
    const list = mine.length ? mine : d.alerts.filter((a) => a.metrics.length === 0);
    return list.map((a) => ({ ...a, x: opts.x === "step" ? a.step : opts.x === "time" ? a.time : null }));
  }

  async function load(chart) {
    const params = { run, metric: chart.metric, x: opts.x, width: chartWidth(chart.div), smooth: opts.smooth };
    if (chart.range) { params.lo = chart.range[0]; params.hi = chart.range[1]; }
    const r = await api("series", params);
    if (me !== page) return;
    chart.series = r.traces.map((t) => ({ ...t, label: multi ? `${chart.metric} (${t.producer})` : chart.metric }));
    chart.alerts = alertsFor(chart.metric);
    await draw(chart, opts);
    hookZoom(chart, opts, load); // re-query the zoomed range at full resolution for the pixels
    chart.div.dataset.loaded = "1";
  }

  async function loadAll(list) {
    const queue = [...list];
    // the first chart alone (nothing competes with it), then the rest two at a time
    if (queue.length) { const c = queue.shift(); try { await load(c); } catch (e) { c.div.textContent = String(e.message || e); } }
    const worker = async () => { while (queue.length) { const c = queue.shift(); try { await load(c); } catch (e) { c.div.textContent = String(e.message || e); } } };
    await Promise.all([worker(), worker()]);
  }
  function reloadAll() { for (const c of charts.values()) { c.range = null; c.uirev += 1; } loadAll([...charts.values()]); }
  function redrawAll() { for (const c of charts.values()) if (c.div.dataset.loaded) draw(c, opts); }

  // live: ask only for the steps after the last one seen
  async function poll() {
    if (me !== page) return;
    try {
      const since = Object.entries(lastBy).map(([p, st]) => `${p}:${st - 1}`);
      const r = await api("points", { run, after: -1, since, x: opts.x, skip_stream: "system" });
      if (d.system.length && ++systemPolls % SYSTEM_EVERY === 0) loadSystem();
      if (me !== page) return;
      statusEl.textContent = r.status; statusEl.className = `status-${r.status}`;
      if (r.reset) { lastBy = { ...r.max_steps }; maxStep = r.max_step; stepsEl.textContent = maxStep + 1; reloadAll(); }
      else {
        for (const [p, st] of Object.entries(r.max_steps || {})) lastBy[p] = Math.max(lastBy[p] ?? -1, st);
        for (const [metric, traces] of Object.entries(r.metrics)) {
          let chart = charts.get(metric);
          if (!chart) { chart = addChart(metric); load(chart); continue; }
          // a smoothed chart is asked again: the server smooths the whole raw series
          if (opts.smooth) { if (chart.div.dataset.loaded) load(chart); continue; }
          for (const t of traces) {
            let s = chart.series.find((x) => x.producer === t.producer);
            if (!s) { s = { ...t, x: [], y: [], step: [], nonfinite: [], label: multi ? `${metric} (${t.producer})` : metric }; chart.series.push(s); }
            // a chart loaded after the step the poll asks from already has some: skip them
            const last = s.step.length ? s.step[s.step.length - 1] : -1;
            t.step.forEach((st, i) => { if (st > last) { s.x.push(t.x[i]); s.y.push(t.y[i]); s.step.push(st); } });
            s.nonfinite.push(...t.nonfinite.filter((p) => p.step > last));
          }
          if (chart.div.dataset.loaded) draw(chart, opts);
        }
        if (r.max_step > maxStep) { maxStep = r.max_step; stepsEl.textContent = maxStep + 1; }
      }
      document.getElementById("live").textContent = r.status === "running" ? "● live" : "";
    } catch (e) {
      // the run deleted while its page is open: say so (a run written again there comes back)
      if (e.status === 404) {
        statusEl.textContent = "deleted"; statusEl.className = "status-deleted";
        document.getElementById("live").textContent = "";
      } /* else the server is away (restarting): the next poll tries again */
    }
    if (me === page) pollTimer = setTimeout(poll, POLL_MS);
  }

  // System: one group of charts per node, over wall time, redrawn every few polls
  const SYSTEM_EVERY = 5;
  let systemPolls = 0;
  const systemCharts = [];
  const systemBox = d.system.length ? el("div", { id: "system" }, el("h3", {}, "System"),
    d.system.map((node) => {
      const box = el("div", { class: "charts" });
      for (const metric of node.metrics) {
        const div = el("div", { class: "chart", "data-metric": metric });
        box.appendChild(div);
        systemCharts.push({ metric, title: metric, div, series: [], range: null, uirev: 1, alerts: [], producer: node.producer });
      }
      return el("section", { class: "group system-node", "data-producer": node.producer },
        el("h3", {}, node.host ? `${node.host} (${node.producer})` : node.producer), box);
    })) : null;
  const sysOpts = { x: "time", smooth: "", log: false };
  async function loadSystemChart(chart) {
    const r = await api("series", { run, metric: chart.metric, x: "time", width: chartWidth(chart.div), producer: chart.producer });
    if (me !== page) return;
    chart.series = r.traces.map((t) => ({ ...t, label: chart.metric }));
    await draw(chart, sysOpts);
    chart.div.dataset.loaded = "1";
  }
  async function loadSystem() {
    for (const c of systemCharts) { try { await loadSystemChart(c); } catch (e) { c.div.textContent = String(e.message || e); } }
  }

  // span breakdown and trace link
  const spanStart = el("input", { id: "span-start", type: "number", placeholder: "from step" });
  const spanStop = el("input", { id: "span-stop", type: "number", placeholder: "to step (excl.)" });
  const spanBody = el("tbody");
  const traceLink = el("a", { id: "trace-link", download: "trace.json" }, "Download Chrome trace (open in ui.perfetto.dev)");
  async function loadSpans() {
    const p = { run, start: spanStart.value, stop: spanStop.value };
    traceLink.href = "/api/trace?" + qs(p);
    try {
      const r = await api("spans", p);
      spanBody.replaceChildren(...r.rows.map((s) => el("tr", {}, el("td", {}, s.name),
        el("td", { class: "num" }, s.count), el("td", { class: "num" }, fmtValue(s.mean_ms)),
        el("td", { class: "num" }, fmtValue(s.total_ms)), el("td", { class: "num" }, fmtValue(s.max_ms)))));
    } catch (e) { spanBody.replaceChildren(el("tr", {}, el("td", { class: "error" }, String(e.message)))); }
  }

  const kv = (id, title, rows) => el("div", {}, el("h3", {}, title),
    rows.length ? el("table", { id }, el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, fmtValue(v))))))
      : el("p", { class: "muted" }, "none"));

  setMain(
    el("h2", { id: "run-title" }, d.run),
    d.error ? el("p", { class: "error", id: "run-error" }, "not everything could be read: " + d.error) : null,
    el("div", { class: "controls" },
      el("span", {}, "status: ", statusEl), el("span", {}, "steps: ", stepsEl),
      el("span", { id: "run-duration" }, "duration: " + fmtDuration(wallOf(d))),
      el("span", { id: "run-active" }, "active: " + fmtDuration(d.active_duration_s)),
      el("span", { id: "run-started" }, "started: " + fmtTime(firstStartOf(d))),
      d.tags.length ? el("span", {}, "tags: ", d.tags.map((t) => el("span", { class: "tag" }, t))) : null,
      d.group ? el("span", {}, "group: " + d.group) : null),
    controls,
    d.metrics.length ? null : el("p", { class: "muted" }, "no metrics yet"),
    chartsBox,
    systemBox,
    el("div", { id: "media" }),
    el("div", { class: "tables" },
      configBox(d, run), kv("summary", "Summary", d.summary),
      el("div", {}, el("h3", {}, "Alerts"), d.alerts.length ? el("table", { id: "alerts" },
        el("thead", {}, el("tr", {}, ["step", "rule", "event", "level", "message"].map((h) => el("th", {}, h)))),
        el("tbody", {}, d.alerts.map((a) => el("tr", {}, el("td", { class: "num" }, a.step ?? ""), el("td", {}, a.rule || ""),
          el("td", {}, a.event || a.state || ""), el("td", {}, a.level || ""), el("td", {}, a.message || "")))))
        : el("p", { class: "muted" }, "none"))),
    d.has_spans ? el("div", {}, el("h3", {}, "Span breakdown"),
      el("div", { class: "controls" }, spanStart, spanStop, el("button", { on: { click: loadSpans } }, "Apply"), traceLink),
      el("table", { id: "spans" }, el("thead", {}, el("tr", {}, ["span", "count", "mean ms", "total ms", "max ms"].map((h) => el("th", {}, h)))), spanBody))
      : null);
  for (const sec of d.sections) for (const m of sec.metrics) addChart(m);
  if (d.has_spans) loadSpans();
  mediaSection(run, document.getElementById("media"), me); // media.js (docs/media.md)
  await loadAll([...charts.values()]);
  await loadSystem();
  if (me === page) pollTimer = setTimeout(poll, POLL_MS);
}

// ------------------------------------------------------------------------- compare page

async function comparePage(runs, me, params) {
  let d;
  try { d = await api("compare", { run: runs }); } catch (e) { return showError(e); }
  if (me !== page) return;
  const labels = d.runs.map((r) => r.run);
  const table = (id, rows) => el("table", { id },
    el("thead", {}, el("tr", {}, el("th", {}, "key"), labels.map((l) => el("th", {}, l)))),
    el("tbody", {}, rows.map((r) => el("tr", { class: differs(r) ? "differs" : "" },
      el("td", {}, r.key || r.metric),
      r.values.map((v, i) => el("td", { class: r.best && r.best.includes(i) ? "best" : "" },
        r.missing.includes(i) ? "—" : fmtValue(v)))))));
  function differs(r) {
    if (r.equal !== undefined) return !r.equal;
    const seen = r.values.map((v, i) => (r.missing.includes(i) ? "\u0000missing" : JSON.stringify(v)));
    return new Set(seen).size > 1;
  }
  const chartsBox = el("div", { class: "charts", id: "charts" });
  setMain(
    el("h2", {}, "Compare"),
    el("p", {}, labels.map((l, i) => el("span", {}, i ? ", " : "", el("a", { href: runLink(l) }, l)))),
    el("p", {}, el("a", { id: "group-link", href: "#/groups?" + qs({ run: labels, by: "auto" }) }, "Group these runs (seeds: mean and band)"),
      " · ", el("a", { id: "sweep-link", href: "#/sweep?" + qs({ run: labels }) }, "Sweep page of these runs")),
    el("h3", {}, "Config (differences highlighted)"), table("compare-config", d.config),
    el("h3", {}, "Identity"), table("compare-identity", d.identity),
    el("h3", {}, "Summary"), table("compare-summary", d.summary),
    el("h3", {}, "Metrics"), null, chartsBox);
  const opts = chartOpts(params);
  const xOptions = d.x_options || [];
  const controls = chartControls(opts, xOptions, (what) => {
    if (what === "log") { for (const c of all) if (c.div.dataset.loaded) draw(c, opts); return; }
    for (const c of all) { c.range = null; c.uirev += 1; }
    const again = [...all];
    const w = async () => { while (again.length) { if (me !== page) return; await load(again.shift()); } };
    Promise.all([w(), w(), w()]);
  });
  chartsBox.before(controls);
  const queue = d.metrics.map((m) => {
    const div = el("div", { class: "chart", "data-metric": m });
    chartsBox.appendChild(div);
    return { metric: m, title: m, div, series: [], range: null, uirev: 1 };
  });
  const all = [...queue];
  // x = step, no smoothing: every run at once from their summaries (/api/overlay: per pixel
  // the true first/min/max/last, so each run's line spans its min-max envelope, and every
  // NaN/inf); else each run's series (smoothing is computed on the raw series)
  async function load(chart) {
    const series = [];
    const label = (run, t) => (t.producer === "main" ? run : `${run} (${t.producer})`);
    const overlay = !opts.smooth && opts.x === "step";
    if (overlay) {
      const q = { run: labels, metric: chart.metric, width: chartWidth(chart.div) };
      if (chart.range) { q.lo = chart.range[0]; q.hi = chart.range[1]; }
      try {
        const r = await api("overlay", q);
        for (const one of r.runs) for (const t of one.traces) series.push({ ...t, label: label(one.run, t) });
      } catch (e) { /* no run has the metric */ }
    } else {
      for (const run of labels) {
        const q = { run, metric: chart.metric, width: chartWidth(chart.div), x: opts.x, smooth: opts.smooth };
        if (chart.range) { q.lo = chart.range[0]; q.hi = chart.range[1]; }
        try {
          const r = await api("series", q);
          for (const t of r.traces) series.push({ ...t, label: label(run, t) });
        } catch (e) { /* this run lacks the metric */ }
      }
    }
    if (me !== page) return;
    chart.series = series;
    await draw(chart, opts);
    hookZoom(chart, opts, load); // every run's series asked again for the range
    chart.div.dataset.source = overlay ? "overlay" : "series";
    chart.div.dataset.loaded = "1";
  }
  const worker = async () => {
    while (queue.length) {
      if (me !== page) return;
      await load(queue.shift());
    }
  };
  await Promise.all([worker(), worker(), worker()]);
}

// ------------------------------------------------------------------------- groups page

// "#1f77b4" -> "rgba(31,119,180,a)"
function rgba(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
}

const BAND_NAMES = { minmax: "min–max", std: "± std", sem: "± standard error", ci: "95% bootstrap CI", none: "no band" };

// one line per group (its mean or median) with its band filled between the band's edges;
// the band's traces break where fewer than two runs have a value (lo/hi null there)
function groupFigure(d, opts) {
  const traces = [];
  d.series.forEach((g, i) => {
    const color = COLORS[i % COLORS.length];
    const name = esc(`${g.label} (${g.runs} run${g.runs === 1 ? "" : "s"})`);
    if (d.band !== "none") {
      traces.push({ type: "scatter", mode: "lines", x: g.x, y: g.lo, line: { width: 0, color },
        hoverinfo: "skip", showlegend: false, connectgaps: false, meta: { role: "band-lo", group: g.label } });
      traces.push({ type: "scatter", mode: "lines", x: g.x, y: g.hi, line: { width: 0, color },
        fill: "tonexty", fillcolor: rgba(color, 0.2), hoverinfo: "skip", showlegend: false,
        connectgaps: false, meta: { role: "band", group: g.label } });
    }
    traces.push({ type: "scatter", mode: g.x.length < 60 ? "lines+markers" : "lines", name, x: g.x, y: g.center,
      customdata: g.n, line: { color, width: 2 }, marker: { size: 4 }, connectgaps: false,
      hovertemplate: `${name}<br>step %{x}: %{y}<br>n = %{customdata}<extra></extra>`,
      meta: { role: "center", group: g.label } });
  });
  const layout = {
    title: { text: esc(`${d.metric}: ${d.agg}, ${BAND_NAMES[d.band]}`), font: { size: 13 } },
    margin: { l: 50, r: 10, t: 30, b: 35 }, showlegend: true,
    legend: { orientation: "h", y: -0.2, font: { size: 10 } },
    xaxis: { title: { text: "step" } }, yaxis: { type: opts.log ? "log" : "linear" },
  };
  return { data: traces, layout };
}

async function groupsPage(params, me) {
  const runs = params.getAll("run");
  const state = { by: params.get("by") || "auto", band: params.get("band") || "std", agg: params.get("agg") || "mean",
    log: params.get("log") === "1" };
  let d;
  try { d = await api("groups", { run: runs, by: state.by }); } catch (e) { return showError(e); }
  if (me !== page) return;
  const go = () => { location.hash = "#/groups?" + qs({ run: runs, by: state.by, band: state.band, agg: state.agg, log: state.log ? "1" : "" }); };
  const by = el("input", { id: "group-by", value: state.by, size: 30, on: { change: (e) => { state.by = e.target.value.trim() || "auto"; go(); } } });
  const band = el("select", { id: "group-band", on: { change: (e) => { state.band = e.target.value; go(); } } },
    Object.entries(BAND_NAMES).map(([k, v]) => el("option", { value: k, selected: k === state.band }, v)));
  const agg = el("select", { id: "group-agg", on: { change: (e) => { state.agg = e.target.value; go(); } } },
    ["mean", "median"].map((k) => el("option", { value: k, selected: k === state.agg }, k)));
  const log = el("input", { type: "checkbox", id: "group-log", checked: state.log, on: { change: (e) => { state.log = e.target.checked; go(); } } });
  const chartsBox = el("div", { class: "charts", id: "charts" });
  setMain(
    el("h2", {}, "Groups"),
    el("div", { class: "controls" },
      el("label", {}, "group by ", by), el("label", {}, "line ", agg), el("label", {}, "band ", band),
      el("label", {}, log, " log y"),
      el("span", { class: "muted" }, "auto: every config key but seed, *_seed, rng")),
    el("table", { id: "groups" },
      el("thead", {}, el("tr", {}, ["group", "runs"].map((h) => el("th", {}, h)))),
      el("tbody", {}, d.groups.map((g) => el("tr", {}, el("td", {}, g.label),
        el("td", {}, g.runs.map((r, i) => el("span", {}, i ? ", " : "", el("a", { href: runLink(r) }, r)))))))),
    el("p", { class: "muted" }, "Runs are aligned on the step; nothing is interpolated. The band is drawn where two or more runs have a value; hover a point for its n."),
    chartsBox);
  const queue = d.metrics.filter((m) => !m.startsWith("time_ms/") && !m.startsWith("count/")).map((m) => {
    const div = el("div", { class: "chart", "data-metric": m });
    chartsBox.appendChild(div);
    return { metric: m, div };
  });
  const worker = async () => {
    while (queue.length) {
      if (me !== page) return;
      const c = queue.shift();
      try {
        const r = await api("groups", { run: runs, by: state.by, metric: c.metric, band: state.band, agg: state.agg, width: chartWidth(c.div) });
        if (me !== page) return;
        await plotlyReady;
        const f = groupFigure(r, state);
        await Plotly.react(c.div, f.data, f.layout, { responsive: true, displaylogo: false });
        c.div.dataset.loaded = "1";
      } catch (e) { c.div.textContent = String(e.message || e); }
    }
  };
  await Promise.all([worker(), worker()]);
}

// ------------------------------------------------------------------------- sweep page

// a colour from low (0) to high (1): dark blue to yellow
function ramp(t) {
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  t = Math.max(0, Math.min(1, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(t)), f = t - i;
  const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  return e;
}

// an axis of the parallel coordinates: value -> 0..1 (numbers linear, or log when all
// positive over more than two decades; categories and booleans evenly spaced)
function axisOf(key, kind, values) {
  if (kind === "category" || kind === "bool") {
    const cats = values.map((v) => JSON.stringify(v));
    const pos = (v) => (v === undefined ? null : cats.length < 2 ? 0.5 : cats.indexOf(JSON.stringify(v)) / (cats.length - 1));
    return { key, pos, ticks: values.map((v) => [pos(v), fmtValue(v)]) };
  }
  const nums = values.filter((v) => typeof v === "number" && Number.isFinite(v));
  let lo = Math.min(...nums), hi = Math.max(...nums);
  const log = lo > 0 && hi / lo > 100;
  const f = log ? Math.log10 : (v) => v;
  const a = f(lo), b = f(hi);
  const pos = (v) => (typeof v !== "number" || !Number.isFinite(v) ? null : b > a ? (f(v) - a) / (b - a) : 0.5);
  return { key: key + (log ? " (log)" : ""), pos, ticks: [[0, fmtValue(lo)], [1, fmtValue(hi)]] };
}

// parallel coordinates as SVG: an axis per varying config key and one for the metric, one
// <path> per run (coloured by the metric; a run without a finite metric drawn grey, dashed)
function parallel(d) {
  const W = 1100, H = 340, top = 40, bottom = 30, left = 60, right = 60;
  const axes = d.keys.map((k) => ({ ...axisOf(k.key, k.kind, k.values), get: (r) => r.config[k.key] }));
  const ms = d.runs.map((r) => r.metric).filter((v) => typeof v === "number" && Number.isFinite(v));
  const mlo = Math.min(...ms), mhi = Math.max(...ms);
  const mpos = (v) => (typeof v !== "number" || !Number.isFinite(v) ? null : mhi > mlo ? (v - mlo) / (mhi - mlo) : 0.5);
  axes.push({ key: d.metric, pos: mpos, ticks: ms.length ? [[0, fmtValue(mlo)], [1, fmtValue(mhi)]] : [], get: (r) => r.metric });
  const xAt = (i) => left + (axes.length < 2 ? 0 : (i * (W - left - right)) / (axes.length - 1));
  const yAt = (p) => top + (1 - p) * (H - top - bottom);
  const root = svg("svg", { id: "parcoords", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  const lines = svg("g", { class: "runs" });
  for (const r of d.runs) {
    const pts = [];
    let pen = "M";
    axes.forEach((a, i) => {
      const p = a.pos(a.get(r));
      if (p === null) { pen = "M"; return; }
      pts.push(`${pen}${xAt(i).toFixed(1)},${yAt(p).toFixed(1)}`);
      pen = "L";
    });
    const m = mpos(r.metric);
    const path = svg("path", { d: pts.join(" "), fill: "none", "stroke-width": 1.5, "data-run": r.run,
      stroke: m === null ? "#aaa" : ramp(m), "stroke-opacity": 0.8 });
    if (m === null) path.setAttribute("stroke-dasharray", "4 3");
    path.appendChild(svg("title", {}, `${r.run}: ${d.metric} = ${fmtValue(r.metric)}`));
    lines.appendChild(path);
  }
  root.appendChild(lines);
  axes.forEach((a, i) => {
    const g = svg("g", { class: "axis" });
    g.appendChild(svg("line", { x1: xAt(i), x2: xAt(i), y1: yAt(0), y2: yAt(1), stroke: "#333" }));
    g.appendChild(svg("text", { x: xAt(i), y: top - 14, "text-anchor": "middle", "font-size": 12, "font-weight": "bold" }, a.key));
    for (const [p, label] of a.ticks.slice(0, 12)) {
      if (p === null) continue;
      g.appendChild(svg("text", { x: xAt(i) + 4, y: yAt(p) + 4, "font-size": 10, fill: "#555" }, label));
    }
    root.appendChild(g);
  });
  return root;
}

async function sweepPage(params, me) {
  const runs = params.getAll("run");
  const group = params.get("group") || "";
  let d;
  try { d = await api("sweep", { run: runs, metric: params.get("metric") || "", group }); } catch (e) { return showError(e); }
  if (me !== page) return;
  const metric = el("select", { id: "sweep-metric", on: { change: (e) => {
    location.hash = "#/sweep?" + qs({ run: runs, metric: e.target.value, group });
  } } }, d.metrics.map((m) => el("option", { value: m, selected: m === d.metric }, m)));
  const num = (v) => (v === null || v === undefined ? "" : Number(v).toFixed(3));
  const scatters = el("div", { class: "charts", id: "scatters" });
  setMain(
    el("h2", {}, "Sweep"),
    el("div", { class: "controls" }, el("label", {}, "metric ", metric),
      el("span", { class: "muted", id: "sweep-count" }, `${d.runs.length} runs` + (group ? `, group ${group}` : "") + `, ${d.keys.length} varying config keys`)),
    el("h3", {}, "Parallel coordinates"),
    d.keys.length ? el("div", { class: "parcoords" }, parallel(d)) : el("p", { class: "muted" }, "no config key varies between these runs"),
    el("h3", {}, "Parameter importance"),
    el("p", { class: "muted" }, d.method + `, fitted on ${d.fitted_on} runs`),
    el("table", { id: "importance" },
      el("thead", {}, el("tr", {}, ["key", "kind", "importance", "± std", "pearson", "spearman"].map((h) => el("th", {}, h)))),
      el("tbody", {}, d.importance.map((r) => el("tr", {}, el("td", {}, r.key),
        el("td", {}, (d.keys.find((k) => k.key === r.key) || {}).kind || ""),
        el("td", { class: "num" }, num(r.importance)), el("td", { class: "num" }, num(r.std)),
        el("td", { class: "num" }, num(r.pearson)), el("td", { class: "num" }, num(r.spearman)))))),
    d.notes.map((n) => el("p", { class: "muted note" }, n)),
    el("h3", {}, `${d.metric} against each key`), scatters);
  await plotlyReady;
  for (const k of d.keys) {
    const div = el("div", { class: "chart", "data-key": k.key });
    scatters.appendChild(div);
    const pts = d.runs.filter((r) => k.key in r.config && typeof r.metric === "number");
    // category labels are drawn by Plotly (a subset of HTML): escaped
    const xs = pts.map((r) => (k.kind === "category" ? esc(fmtValue(r.config[k.key])) : r.config[k.key]));
    const positive = k.kind === "number" && xs.every((x) => x > 0);
    const wide = positive && Math.max(...xs) / Math.min(...xs) > 100;
    await Plotly.react(div, [{ type: "scatter", mode: "markers", x: xs, y: pts.map((r) => r.metric),
      text: pts.map((r) => esc(r.run)), hovertemplate: "%{text}<br>%{x}: %{y}<extra></extra>",
      marker: { size: 8, color: COLORS[0] } }],
    { title: { text: esc(`${d.metric} vs ${k.key}`), font: { size: 13 } }, margin: { l: 50, r: 10, t: 30, b: 35 },
      xaxis: { type: k.kind === "category" ? "category" : wide ? "log" : "linear", title: { text: esc(k.key) } } },
    { responsive: true, displaylogo: false });
    div.dataset.loaded = "1";
  }
}

window.addEventListener("hashchange", route);
route();
