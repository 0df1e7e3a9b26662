// attnkit attention explorer: the views. No network, no dependencies. The data comes from
// the <script id="attnkit-data"> JSON, read through attnkitDecoder (explorer_data.js).
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("attnkit-data").textContent);
  const L = D.L, H = D.H, Hkv = D.Hkv, Tq = D.Tq, Tk = D.Tk, G = H / Hkv;
  const { inflate, headData, maskData, LUT, CSS } = attnkitDecoder(D);
  const $ = (id) => document.getElementById(id);
  const app = $("app");
  const state = { layer: 0, head: 0, view: D.view, scale: "head", zoom: 1, focus: null };
  const MASK_A = 0xffd6d6d6, MASK_B = 0xffa8a8a8; // stripe colours of masked cells (ABGR)
  const ROW = 20; // px per token in the lines view
  let ticket = 0; // the newest render; older ones stop when they see a newer ticket

  function vmaxOf(l, h, rowMax, r) {
    if (state.scale === "row") return rowMax[r] > 0 ? rowMax[r] : 1;
    if (state.scale === "one") return 1;
    return D.headMax[l][h];
  }
  function colorIndex(v, vmax) { return Math.min(255, (v / vmax * 255 + 0.5) | 0); }

  // The readout sits beside the pointer (or the hovered token), kept inside the window.
  function showTip(text, x, y) {
    const tip = $("tip");
    tip.textContent = text;
    tip.style.display = text ? "block" : "none";
    if (!text) return;
    const w = tip.offsetWidth, h = tip.offsetHeight;
    const left = x + 14 + w > window.innerWidth - 4 ? x - 14 - w : x + 14;
    const top = y + 16 + h > window.innerHeight - 4 ? y - 10 - h : y + 16;
    tip.style.left = Math.max(4, left) + "px";
    tip.style.top = Math.max(4, top) + "px";
  }
  function hideTip() { showTip("", 0, 0); }

  // -- overview ---------------------------------------------------------------------------
  const thumbs = [];
  async function buildOverview() {
    const box = $("overview"), rows = D.thumb.rows, cols = D.thumb.cols;
    const codes = await inflate(D.thumb.data);
    const side = Math.max(18, Math.min(56, Math.floor(560 / (H + Hkv))));
    const grid = document.createElement("div");
    grid.className = "grid";
    if (Hkv < H) { // one label over each group of heads that share a key/value head
      const head = document.createElement("div");
      head.className = "layer-row";
      head.appendChild(Object.assign(document.createElement("span"), { className: "rl" }));
      for (let g = 0; g < Hkv; g++) {
        const lab = document.createElement("span");
        lab.className = "group kvlabel";
        lab.style.width = G * (side + 4) + "px";
        const heads = G > 1 ? `heads ${g * G}-${g * G + G - 1}` : `head ${g}`;
        lab.title = `key/value head ${g}: query ${heads}`;
        // The long label where it fits, else the short one (the title has it all).
        lab.textContent = G * (side + 4) >= 100 ? `kv ${g} (${heads})` : `kv ${g}`;
        head.appendChild(lab);
      }
      grid.appendChild(head);
    }
    for (let l = 0; l < L; l++) {
      const row = document.createElement("div");
      row.className = "layer-row";
      const lab = document.createElement("span");
      lab.className = "rl";
      lab.textContent = "L" + D.layers[l];
      row.appendChild(lab);
      thumbs.push([]);
      for (let g = 0; g < Hkv; g++) {
        const group = document.createElement("span");
        group.className = "group";
        for (let h = g * G; h < (g + 1) * G; h++) {
          const b = document.createElement("button");
          b.className = "thumb";
          b.dataset.layer = l; b.dataset.head = h;
          b.title = `layer ${D.layers[l]}, head ${h}` + (Hkv < H ? `, kv head ${g}` : "");
          const c = document.createElement("canvas");
          c.width = cols; c.height = rows;
          c.style.width = side + "px";
          c.style.height = Math.max(8, Math.round(side * Math.min(2, rows / cols))) + "px";
          const img = new ImageData(cols, rows), px = new Uint32Array(img.data.buffer);
          const o = (l * H + h) * rows * cols;
          for (let i = 0; i < rows * cols; i++) {
            const v = codes[o + i];
            px[i] = v === 255 ? (((i % cols) + ((i / cols) | 0)) & 1 ? MASK_A : MASK_B)
              : LUT[Math.round(v * 255 / 254)];
          }
          c.getContext("2d").putImageData(img, 0, 0);
          b.appendChild(c);
          b.addEventListener("click", () => select(l, h));
          group.appendChild(b);
          thumbs[l].push(b);
        }
        row.appendChild(group);
      }
      grid.appendChild(row);
    }
    box.appendChild(grid);
  }

  // -- lines view -------------------------------------------------------------------------
  function buildTokens() {
    for (const [id, toks, attr] of [["qtoks", D.qTokens, "i"], ["ktoks", D.kTokens, "j"]]) {
      const ol = $(id), frag = document.createDocumentFragment();
      if (toks.length > D.linesMax) continue;
      toks.forEach((t, i) => {
        const li = document.createElement("li");
        li.textContent = t === "" ? "\u2205" : t;
        li.dataset[attr] = i;
        li.title = `${attr === "i" ? "query" : "key"} ${i}`;
        li.addEventListener("mouseenter", () => {
          state.focus = { side: attr, index: i };
          drawLinesNow();
        });
        frag.appendChild(li);
      });
      ol.appendChild(frag);
    }
    $("lines-body").addEventListener("mouseleave", () => { state.focus = null; drawLinesNow(); });
  }

  let linesData = null; // {l, h, w, rowMax, keep} of the head the lines view shows
  function drawLinesNow() { if (linesData) drawLines(linesData); }
  function drawLines({ l, h, w, rowMax, keep }) {
    const canvas = $("lines"), dpr = window.devicePixelRatio || 1;
    const cssW = 220, cssH = Math.max(Tq, Tk) * ROW;
    if (canvas.width !== cssW * dpr || canvas.height !== cssH * dpr) {
      canvas.width = cssW * dpr; canvas.height = cssH * dpr;
      canvas.style.width = cssW + "px"; canvas.style.height = cssH + "px";
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cssW, cssH);
    const f = state.focus, qs = $("qtoks").children, ks = $("ktoks").children;
    for (const li of [...qs, ...ks]) { li.className = ""; li.style.background = li.style.color = ""; }
    hideTip();
    // Lines are bucketed by opacity so that a whole head is a dozen strokes, not Tq*Tk.
    const buckets = Array.from({ length: 10 }, () => new Path2D());
    const add = (r, c, a) => {
      if (a < 0.02) return;
      const p = buckets[Math.min(9, Math.floor(a * 10))];
      p.moveTo(0, (r + 0.5) * ROW); p.lineTo(cssW, (c + 0.5) * ROW);
    };
    const mark = (li, v, m, masked) => {
      if (masked) li.classList.add("masked");
      else {
        const k = colorIndex(v, m > 0 ? m : 1);
        li.style.background = CSS[k];
        if (k > 150) li.style.color = "#fff"; // dark cells: keep the token readable
      }
    };
    if (f && f.side === "i") { // one query: its keys, coloured by share of its row max
      const r = f.index, m = rowMax[r];
      let top = -1;
      qs[r].classList.add("focus");
      for (let c = 0; c < Tk; c++) {
        const v = w[r * Tk + c], masked = keep && !keep[r * Tk + c];
        mark(ks[c], v, m, masked);
        if (!masked && (top < 0 || v > w[r * Tk + top])) top = c;
        if (!masked && m > 0) add(r, c, v / m);
      }
      if (top >= 0) ks[top].classList.add("top");
      const at = qs[r].getBoundingClientRect();
      showTip(top < 0 ? `query ${r}: every key is masked`
        : `query ${r} ${JSON.stringify(D.qTokens[r])}: top key ${top} ` +
          `${JSON.stringify(D.kTokens[top])} (${w[r * Tk + top].toPrecision(3)})`,
      at.right, at.top);
    } else if (f && f.side === "j") { // one key: the queries that read it
      const c = f.index;
      let m = 0;
      let reader = -1;
      for (let r = 0; r < Tq; r++) {
        if (keep && !keep[r * Tk + c]) continue;
        if (reader < 0 || w[r * Tk + c] > w[reader * Tk + c]) reader = r;
        m = Math.max(m, w[r * Tk + c]);
      }
      ks[c].classList.add("focus");
      const at = ks[c].getBoundingClientRect();
      showTip(reader < 0 ? `key ${c}: no query may attend it`
        : `key ${c} ${JSON.stringify(D.kTokens[c])}: read most by query ${reader} ` +
          `${JSON.stringify(D.qTokens[reader])} (${w[reader * Tk + c].toPrecision(3)})`,
      at.right, at.top);
      for (let r = 0; r < Tq; r++) {
        const v = w[r * Tk + c], masked = keep && !keep[r * Tk + c];
        mark(qs[r], v, m, masked);
        if (!masked && m > 0) add(r, c, v / m);
      }
    } else {
      for (let r = 0; r < Tq; r++) {
        const vm = vmaxOf(l, h, rowMax, r);
        for (let c = 0; c < Tk; c++) {
          if (keep && !keep[r * Tk + c]) continue;
          add(r, c, w[r * Tk + c] / vm);
        }
      }
    }
    ctx.lineWidth = 1.5;
    buckets.forEach((p, i) => {
      ctx.strokeStyle = `rgba(203,24,29,${((i + 1) / 10).toFixed(2)})`;
      ctx.stroke(p);
    });
  }

  // -- matrix view ------------------------------------------------------------------------
  let matrixData = null; // {l, h, w, rowMax, keep, z}: the head on the canvas, z = css px/cell
  // Css px per cell that fits the head in the pane (room left for the token labels and
  // the axis titles), so a short sequence fills the pane instead of a corner of it.
  const MAX_CELL = 160;
  function fitZoom() {
    const box = $("mscroll"), aw = Math.max(100, box.clientWidth - 100);
    const ah = Math.max(100, box.clientHeight - 100);
    return Math.min(aw / Tk, ah / Tq, MAX_CELL);
  }
  function drawMatrix(d) {
    const { l, h, w, rowMax, keep } = d, canvas = $("matrix");
    const dpr = window.devicePixelRatio || 1, z = fitZoom() * state.zoom;
    d.z = z;
    let bw, bh, px;
    if (z * dpr >= 1) { // whole cells of p x p pixels; masked cells striped
      const p = Math.max(1, Math.min(Math.floor(z * dpr), Math.floor(4096 / Math.max(Tq, Tk))));
      bw = Tk * p; bh = Tq * p;
      const img = new ImageData(bw, bh);
      px = new Uint32Array(img.data.buffer);
      const period = p >= 3 ? 6 : 2;
      for (let r = 0; r < Tq; r++) {
        const vm = vmaxOf(l, h, rowMax, r);
        for (let c = 0; c < Tk; c++) {
          const i = r * Tk + c, masked = keep && !keep[i];
          const color = masked ? 0 : LUT[colorIndex(w[i], vm)];
          for (let y = r * p; y < r * p + p; y++) {
            const o = y * bw;
            for (let x = c * p; x < c * p + p; x++) {
              px[o + x] = masked ? ((x + y) % period < period / 2 ? MASK_A : MASK_B) : color;
            }
          }
        }
      }
      canvas.width = bw; canvas.height = bh;
      canvas.getContext("2d").putImageData(img, 0, 0);
    } else { // more cells than pixels: each pixel shows the largest weight it covers
      bw = Math.max(1, Math.round(Tk * z * dpr)); bh = Math.max(1, Math.round(Tq * z * dpr));
      const top = new Float32Array(bw * bh), kept = new Uint8Array(bw * bh);
      const colPx = new Int32Array(Tk);
      for (let c = 0; c < Tk; c++) colPx[c] = Math.floor(c * bw / Tk);
      for (let r = 0; r < Tq; r++) {
        const o = Math.floor(r * bh / Tq) * bw, vm = vmaxOf(l, h, rowMax, r);
        for (let c = 0, i = r * Tk; c < Tk; c++, i++) {
          if (keep && !keep[i]) continue;
          const j = o + colPx[c], v = w[i] / vm;
          kept[j] = 1;
          if (v > top[j]) top[j] = v;
        }
      }
      const img = new ImageData(bw, bh);
      px = new Uint32Array(img.data.buffer);
      for (let j = 0; j < bw * bh; j++) {
        px[j] = kept[j] ? LUT[Math.min(255, (top[j] * 255 + 0.5) | 0)]
          : ((j % bw) + ((j / bw) | 0)) & 1 ? MASK_A : MASK_B;
      }
      canvas.width = bw; canvas.height = bh;
      canvas.getContext("2d").putImageData(img, 0, 0);
    }
    canvas.style.width = Tk * z + "px";
    canvas.style.height = Tq * z + "px";
    canvas.style.imageRendering = z * dpr >= 1 ? "pixelated" : "auto";
    drawAxisLabels(z);
  }
  function drawAxisLabels(z) {
    const box = $("mbox");
    for (const old of box.querySelectorAll(".axis")) old.remove();
    if (z < 9) return;
    const font = Math.min(14, Math.floor(z - 2)) + "px";
    const rows = document.createElement("div"), cols = document.createElement("div");
    rows.className = "axis rows"; cols.className = "axis cols";
    D.qTokens.forEach((t) => {
      const s = document.createElement("span");
      s.textContent = t; s.style.height = z + "px"; s.style.fontSize = font;
      rows.appendChild(s);
    });
    D.kTokens.forEach((t) => {
      const s = document.createElement("span");
      s.textContent = t; s.style.width = z + "px"; s.style.fontSize = font;
      cols.appendChild(s);
    });
    box.append(rows, cols);
  }
  function matrixHover(ev) {
    const d = matrixData;
    if (!d) return;
    const rect = $("matrix").getBoundingClientRect();
    const c = Math.floor((ev.clientX - rect.left) / rect.width * Tk);
    const r = Math.floor((ev.clientY - rect.top) / rect.height * Tq);
    if (r < 0 || r >= Tq || c < 0 || c >= Tk) return;
    const hl = $("hline"), vl = $("vline"), cv = $("matrix");
    hl.style.display = vl.style.display = "block";
    hl.style.top = cv.offsetTop + r * d.z + "px"; hl.style.height = Math.max(1, d.z) + "px";
    hl.style.left = cv.offsetLeft + "px"; hl.style.width = Tk * d.z + "px";
    vl.style.left = cv.offsetLeft + c * d.z + "px"; vl.style.width = Math.max(1, d.z) + "px";
    vl.style.top = cv.offsetTop + "px"; vl.style.height = Tq * d.z + "px";
    const i = r * Tk + c, masked = d.keep && !d.keep[i];
    showTip(`query ${r} ${JSON.stringify(D.qTokens[r])} \u2192 key ${c} ` +
      `${JSON.stringify(D.kTokens[c])}: ` +
      (masked ? "masked (may not attend)" : d.w[i].toPrecision(3)), ev.clientX, ev.clientY);
  }

  // -- selection and rendering ------------------------------------------------------------
  function nextFrame() { return new Promise((r) => requestAnimationFrame(() => r())); }
  async function render() {
    const my = ++ticket, t0 = performance.now(), l = state.layer, h = state.head;
    for (const row of thumbs) for (const b of row) b.classList.remove("selected");
    thumbs[l][h].classList.add("selected");
    thumbs[l][h].scrollIntoView({ block: "nearest", inline: "nearest" });
    app.dataset.layer = l; app.dataset.head = h; app.dataset.view = state.view;
    $("selection").textContent = `layer ${D.layers[l]} \u00b7 head ${h}`;
    $("group").textContent = Hkv < H ? `kv head ${Math.floor(h / G)}` +
      (G > 1 ? `, shared with heads ${Math.floor(h / G) * G}-${Math.floor(h / G) * G + G - 1}`
        : "") : "";
    for (const v of ["lines", "matrix"]) {
      $(v + "-view").hidden = state.view !== v;
      $("tab-" + v).classList.toggle("on", state.view === v);
    }
    $("zoom").hidden = state.view !== "matrix";
    hideTip();
    const [{ w, rowMax }, keep] = await Promise.all([headData(l, h), maskData(l, h)]);
    if (my !== ticket) return;
    const d = { l, h, w, rowMax, keep };
    if (state.view === "lines") {
      const tooMany = Math.max(Tq, Tk) > D.linesMax;
      $("lines-note").textContent = tooMany ? `The lines view draws up to ${D.linesMax} ` +
        `tokens a side; this page has ${Tq} x ${Tk}: press m for the matrix.` : "";
      $("lines-body").hidden = tooMany;
      linesData = d;
      if (!tooMany) drawLines(d);
    } else {
      matrixData = d;
      drawMatrix(d);
    }
    $("vmax").textContent = state.scale === "row" ? "row max"
      : (state.scale === "one" ? 1 : D.headMax[l][h]).toPrecision(3);
    await nextFrame();
    if (my !== ticket) return;
    app.dataset.state = "ready";
    api.lastRender = { layer: l, head: h, view: state.view, ms: performance.now() - t0 };
  }
  function select(l, h) {
    state.layer = Math.max(0, Math.min(L - 1, l));
    state.head = Math.max(0, Math.min(H - 1, h));
    state.focus = null;
    return (api.rendered = render());
  }
  function setView(v) { state.view = v; return (api.rendered = render()); }

  function onKey(ev) {
    if (ev.target && ev.target.tagName === "SELECT") return;
    const k = ev.key;
    if (k === "ArrowLeft") select(state.layer, state.head - 1);
    else if (k === "ArrowRight") select(state.layer, state.head + 1);
    else if (k === "ArrowUp") select(state.layer - 1, state.head);
    else if (k === "ArrowDown") select(state.layer + 1, state.head);
    else if (k === "l") setView("lines");
    else if (k === "m") setView("matrix");
    else if (k === "s") {
      const order = ["head", "row", "one"];
      $("scale").value = state.scale = order[(order.indexOf(state.scale) + 1) % 3];
      api.rendered = render();
    } else return;
    ev.preventDefault();
  }

  // Read-back API, for tests and the console: weights and mask as the page decoded them.
  const api = {
    select, setView, rendered: null, lastRender: null,
    state: () => ({ ...state }),
    weights: async (l, h) => Array.from((await headData(l, h)).w),
    mask: async (l, h) => { const m = await maskData(l, h); return m && Array.from(m); },
    pixel: (x, y) => Array.from($("matrix").getContext("2d").getImageData(x, y, 1, 1).data),
  };
  window.attnkit = api;

  async function main() {
    $("title").textContent = D.title;
    document.title = D.title;
    const plural = (n, word) => `${n} ${word}${n > 1 ? "s" : ""}`;
    const heads = Hkv < H ? `${plural(H, "query head")} sharing ${plural(Hkv, "key/value head")}`
      : plural(H, "head");
    // How close the page's numbers are: half a step of each row's largest weight (uint8
    // pages) or half precision.
    const pct = (100 / (2 * D.levels)).toPrecision(2);
    $("facts").textContent = `${plural(L, "layer")} \u00d7 ${heads} \u00b7 ${Tq} queries ` +
      `\u00d7 ${Tk} keys \u00b7 ` + (D.precision === "float16"
        ? "weights as half-precision floats (about 3 significant digits)"
        : `weights shown to \u00b1${pct}% of each row's largest`);
    const bar = $("colorbar").getContext("2d");
    for (let x = 0; x < 120; x++) {
      bar.fillStyle = CSS[Math.round(x * 255 / 119)];
      bar.fillRect(x, 0, 1, 12);
    }
    buildTokens();
    await buildOverview();
    for (const b of document.querySelectorAll(".tabs button")) {
      b.addEventListener("click", () => setView(b.dataset.view));
    }
    $("scale").addEventListener("change", (e) => { state.scale = e.target.value; render(); });
    for (const b of document.querySelectorAll("#zoom button")) {
      b.addEventListener("click", () => {
        const z = b.dataset.zoom;
        state.zoom = z === "fit" ? 1 : Math.max(0.25, Math.min(64, state.zoom * (z === "in" ? 1.5 : 1 / 1.5)));
        render();
      });
    }
    $("matrix").addEventListener("mousemove", matrixHover);
    $("matrix").addEventListener("mouseleave", () => {
      $("hline").style.display = $("vline").style.display = "none";
      hideTip();
    });
    document.addEventListener("keydown", onKey);
    let resize = 0;
    window.addEventListener("resize", () => {
      clearTimeout(resize);
      resize = setTimeout(() => { if (state.view === "matrix") render(); }, 150);
    });
    await select(0, 0);
  }
  api.ready = main().catch((err) => {
    app.dataset.state = "error";
    $("message").textContent = "The explorer could not start: " + err;
    console.error(err);
  });
})();
