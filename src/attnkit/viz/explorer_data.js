// attnkit attention explorer: reading the data that attnkit/viz/explorer_data.py writes.
// Each head is deflated then base64-encoded; uint8 heads carry one float32 step per row
// (weight = code * step), float16 heads are IEEE half floats. Masks are bit-packed.
"use strict";
function attnkitDecoder(D) {
  const Tq = D.Tq, Tk = D.Tk;
  // -- decoding ---------------------------------------------------------------------------
  function bytesOf(b64) {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64);
    const s = atob(b64), out = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  async function inflate(b64) {
    const stream = new Blob([bytesOf(b64)]).stream()
      .pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  let halfTable = null; // float value of every 16-bit pattern, built on first use
  function halfToFloat() {
    if (halfTable) return halfTable;
    halfTable = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) {
      const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
      halfTable[h] = e === 0 ? s * f * 2 ** -24
        : e === 31 ? (f ? NaN : s * Infinity) : s * (1 + f / 1024) * 2 ** (e - 15);
    }
    return halfTable;
  }

  const headCache = new Map(); // "l,h" -> Promise<{w, rowMax}>, the few most recent
  function headData(l, h) {
    const key = l + "," + h;
    if (headCache.has(key)) {
      const p = headCache.get(key);
      headCache.delete(key); headCache.set(key, p); // most recent last
      return p;
    }
    const p = (async () => {
      const src = D.heads[l][h], raw = await inflate(src.data), n = Tq * Tk;
      const w = new Float32Array(n);
      if (D.precision === "float16") {
        const t = halfToFloat(), u16 = new Uint16Array(raw.buffer, raw.byteOffset, n);
        for (let i = 0; i < n; i++) w[i] = t[u16[i]];
      } else {
        const step = new Float32Array(bytesOf(src.step).buffer);
        for (let r = 0; r < Tq; r++) {
          const s = step[r], o = r * Tk;
          for (let c = 0; c < Tk; c++) w[o + c] = raw[o + c] * s;
        }
      }
      const rowMax = new Float32Array(Tq);
      for (let r = 0; r < Tq; r++) {
        let m = 0;
        for (let c = r * Tk, e = c + Tk; c < e; c++) if (w[c] > m) m = w[c];
        rowMax[r] = m;
      }
      return { w, rowMax };
    })();
    headCache.set(key, p);
    // Keep about 64 MB of decoded heads.
    while (headCache.size > Math.max(2, Math.floor(16e6 / (Tq * Tk)))) {
      headCache.delete(headCache.keys().next().value);
    }
    return p;
  }

  const maskCache = new Map();
  function maskData(l, h) { // Promise<Uint8Array | null>: 1 = may attend
    if (!D.mask) return Promise.resolve(null);
    const ml = D.mask.L > 1 ? l : 0, mh = D.mask.H > 1 ? h : 0, key = ml + "," + mh;
    if (!maskCache.has(key)) {
      maskCache.set(key, inflate(D.mask.data[ml][mh]).then((bits) => {
        const n = Tq * Tk, keep = new Uint8Array(n);
        for (let i = 0; i < n; i++) keep[i] = (bits[i >> 3] >> (7 - (i & 7))) & 1;
        return keep;
      }));
    }
    return maskCache.get(key);
  }

  // -- colours ----------------------------------------------------------------------------
  function hexRGB(s) { return [1, 3, 5].map((i) => parseInt(s.slice(i, i + 2), 16)); }
  const LUT = new Uint32Array(256), CSS = new Array(256);
  (function buildLut() {
    const anchors = D.colors.map(hexRGB), n = anchors.length - 1;
    for (let i = 0; i < 256; i++) {
      const x = (i / 255) * n, k = Math.min(n - 1, Math.floor(x)), f = x - k;
      const [r, g, b] = [0, 1, 2].map((c) =>
        Math.round(anchors[k][c] + f * (anchors[k + 1][c] - anchors[k][c])));
      LUT[i] = (0xff << 24) | (b << 16) | (g << 8) | r; // ImageData is RGBA in memory
      CSS[i] = `rgb(${r},${g},${b})`;
    }
  })();
  return { bytesOf, inflate, headData, maskData, LUT, CSS };
}
