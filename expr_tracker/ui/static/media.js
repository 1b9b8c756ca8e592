// et ui: the Media section of a run page (docs/media.md "In the dashboard"): images with a
// step slider, histograms over steps (a heatmap of bins x steps and the latest as bars),
// tables paged and sortable. Uses app.js's el, api, esc, chartWidth and plotlyReady; every
// text goes in as text, file URLs are built from the run id and the reference's path.
"use strict";

const MEDIA_PAGE_ROWS = 25;

function mediaUrl(run, path) { return "/api/media/file?" + qs({ run, path }); }

function mediaImages(run, m) {
  const img = el("div", { class: "media-images" });
  const label = el("span", { class: "media-step" });
  function show(i) {
    label.textContent = "step " + m.steps[i];
    img.replaceChildren(...m.items[i].map((ref) => el("figure", {},
      el("img", { src: mediaUrl(run, ref.path || ""), alt: ref.caption || m.key, width: ref.width, height: ref.height }),
      ref.caption ? el("figcaption", {}, ref.caption) : null)));
  }
  const last = m.steps.length - 1;
  const slider = el("input", { type: "range", class: "media-slider", min: "0", max: String(last), step: "1",
    value: String(last), on: { input: (e) => show(Number(e.target.value)) } });
  show(last);
  return [el("div", { class: "controls" }, slider, label), img];
}

function mediaHistograms(m) {
  const heat = el("div", { class: "chart media-heatmap" });
  const bars = el("div", { class: "chart media-bars" });
  (async () => {
    await plotlyReady;
    // every step's counts onto one grid of bins between the smallest and largest edge
    let lo = Infinity, hi = -Infinity;
    for (const h of m.items) { lo = Math.min(lo, h.bins[0]); hi = Math.max(hi, h.bins[h.bins.length - 1]); }
    const n = Math.max(...m.items.map((h) => h.values.length)), width = (hi - lo) / n || 1;
    const centers = Array.from({ length: n }, (_, i) => lo + (i + 0.5) * width);
    const z = centers.map(() => m.items.map(() => 0));
    m.items.forEach((h, j) => h.values.forEach((c, k) => {
      const mid = (h.bins[k] + h.bins[k + 1]) / 2;
      const row = Math.min(n - 1, Math.max(0, Math.floor((mid - lo) / width)));
      z[row][j] += c;
    }));
    const layout = { margin: { l: 50, r: 10, t: 30, b: 40 }, title: { text: esc(m.key), font: { size: 13 } } };
    Plotly.react(heat, [{ type: "heatmap", x: m.steps, y: centers, z, colorscale: "Viridis", hovertemplate: "step %{x}<br>%{y}: %{z}<extra></extra>" }],
      { ...layout, xaxis: { title: { text: "step" } } }, { responsive: true, displaylogo: false });
    const h = m.items[m.items.length - 1];
    Plotly.react(bars, [{ type: "bar", x: h.values.map((_, k) => (h.bins[k] + h.bins[k + 1]) / 2), y: h.values,
      width: h.values.map((_, k) => h.bins[k + 1] - h.bins[k]) }],
      { ...layout, title: { text: esc(`${m.key} at step ${m.steps[m.steps.length - 1]}`), font: { size: 13 } } },
      { responsive: true, displaylogo: false });
  })().catch((e) => { heat.textContent = String(e.message || e); });
  return [el("div", { class: "charts" }, heat, bars)];
}

function mediaCell(run, v) {
  if (v && typeof v === "object" && v._type === "image" && v.path)
    return el("img", { src: mediaUrl(run, v.path), class: "media-cell", alt: v.caption || "" });
  if (v && typeof v === "object") return v._type ? `<${v._type}>` : JSON.stringify(v);
  return v === null || v === undefined ? "" : typeof v === "number" ? fmtValue(v) : String(v);
}

function mediaTable(run, m) {
  const t = m.table;
  if (!t) return [el("p", { class: "muted" }, "table not readable")];
  let sortCol = -1, desc = false, pageNo = 0;
  const body = el("tbody");
  const info = el("span", { class: "muted" });
  function rows() {
    const r = t.data.slice();
    if (sortCol >= 0) r.sort((a, b) => {
      const x = a[sortCol], y = b[sortCol];
      const c = typeof x === "number" && typeof y === "number" ? x - y : String(x ?? "").localeCompare(String(y ?? ""));
      return desc ? -c : c;
    });
    return r;
  }
  // a table larger than what /api/media sent is paged and sorted by the server (whole table)
  const remote = t.nrows > t.data.length ? m.items[m.items.length - 1].path : null;
  let asked = 0;
  function fill(r, pages) {
    body.replaceChildren(...r.map((row) =>
      el("tr", {}, row.map((v) => el("td", { class: typeof v === "number" ? "num" : null }, mediaCell(run, v))))));
    info.textContent = `page ${pageNo + 1} of ${pages} · ${t.nrows} rows (step ${m.steps[m.steps.length - 1]})`;
  }
  async function draw() {
    const pages = Math.max(1, Math.ceil(t.nrows / MEDIA_PAGE_ROWS));
    pageNo = Math.min(pageNo, pages - 1);
    if (!remote) {
      fill(rows().slice(pageNo * MEDIA_PAGE_ROWS, (pageNo + 1) * MEDIA_PAGE_ROWS), pages);
      return;
    }
    const me = ++asked, q = { run, path: remote, offset: pageNo * MEDIA_PAGE_ROWS, limit: MEDIA_PAGE_ROWS };
    if (sortCol >= 0) { q.sort = t.columns[sortCol]; if (desc) q.desc = 1; }
    try {
      const d = await api("media/table", q);
      if (me === asked) fill(d.data, pages);
    } catch (e) { if (me === asked) info.textContent = String(e.message || e); }
  }
  const head = el("tr", {}, t.columns.map((c, i) => el("th", { class: "sortable", on: { click: () => {
    desc = sortCol === i ? !desc : false; sortCol = i; draw(); } } }, c)));
  draw();
  return [el("table", { class: "media-table" }, el("thead", {}, head), body),
    el("div", { class: "controls" },
      el("button", { on: { click: () => { pageNo = Math.max(0, pageNo - 1); draw(); } } }, "previous"),
      el("button", { on: { click: () => { pageNo += 1; draw(); } } }, "next"), info)];
}

// fills `box` (the run page's #media) with the run's media; nothing when there are none
async function mediaSection(run, box, me) {
  let d;
  try { d = await api("media", { run }); } catch (e) { box.textContent = String(e.message || e); return; }
  if (me !== page || !d.media.length) return;
  box.replaceChildren(el("h3", {}, "Media"),
    ...(d.error ? [el("p", { class: "error" }, d.error)] : []),
    ...d.media.map((m) => el("section", { class: `media media-${m.kind}`, "data-key": m.key }, el("h4", {}, m.key),
      m.kind === "image" ? mediaImages(run, m) : m.kind === "histogram" ? mediaHistograms(m) : mediaTable(run, m))));
}
