"""The explorer page in a real headless browser (Debian's chromium, driven by Playwright).

`make test` installs chromium (apt-get) and Playwright (the ``dev`` extra); these tests skip
only when no chromium can be found. One browser serves the module; each test opens a fresh
page, records console errors, page errors and every request, and checks what a person would
see: a click, a hover, a key press, a pixel, a screenshot.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

import attnkit.numpy as an
from attnkit.viz import explore

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
LOW_END = (255, 245, 240)  # the colour of weight 0: the first anchor of the colour scale


def find_chromium() -> str | None:
    for name in (os.environ.get("ATTNKIT_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and (path := shutil.which(name)):
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no chromium found (looked for $ATTNKIT_CHROMIUM, chromium, "
                    "chromium-browser, google-chrome); `make test` installs Debian's chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("chromium is here but Playwright is not: pip install -e '.[dev]'")
    with sync_playwright() as pw:
        # Playwright gives each launch a fresh temporary profile (--user-data-dir).
        b = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        b.close()


@dataclass
class Opened:
    page: object
    url: str
    errors: list = field(default_factory=list)
    requests: list = field(default_factory=list)

    def eval(self, js: str, arg=None):
        return self.page.evaluate(js, arg)

    def check_clean(self) -> None:
        assert self.errors == [], f"console errors: {self.errors}"
        assert [u for u in self.requests if u != self.url] == [], \
            f"the page asked the network for {self.requests}"


def open_page(browser, path, *, width: int = 1280, height: int = 760) -> Opened:
    page = browser.new_page(viewport={"width": width, "height": height})
    opened = Opened(page, path.as_uri())
    page.on("console", lambda m: m.type == "error" and opened.errors.append(m.text))
    page.on("pageerror", lambda e: opened.errors.append(f"page error: {e}"))
    page.on("request", lambda r: opened.requests.append(r.url))
    page.goto(opened.url)
    page.wait_for_function("document.getElementById('app').dataset.state !== 'loading'",
                           timeout=15_000)
    assert page.get_attribute("#app", "data-state") == "ready", page.inner_text("#message")
    return opened


# -- the pages -------------------------------------------------------------------------------
T = 12
TOKENS = ["the", "cat", "sat", "on", "<b>&amp;</b>", "mat", "and", "then", "it", "slept",
          "<pad>", "<pad>"]
KEEP = an.causal_mask(T, T) & an.sequence_mask(np.array([10]), T)  # causal and padding
ZERO_CELL = (6, 2)  # an allowed cell whose weight is exactly 0
MASKED_CELL = (2, 9)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """3 layers x 4 heads sharing 2 key/value heads, 12 tokens, causal + padding mask."""
    rng = np.random.default_rng(7)
    w = an.masked_softmax(rng.normal(0.0, 2.5, size=(3, 4, T, T)), mask=KEEP)
    w[0, 0][ZERO_CELL] = 0.0
    w = w.astype(np.float32)
    ex = explore(w, TOKENS, mask=KEEP, kv_heads=2, title="small")
    return w, ex.save(tmp_path_factory.mktemp("pages") / "small.html")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """1 layer x 2 heads over 2,048 tokens, causal."""
    n = 2048
    rng = np.random.default_rng(8)
    keep = an.causal_mask(n, n)
    s = rng.standard_normal((2, n, n), dtype=np.float32) * 2
    s = np.where(keep, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    w = e / e.sum(-1, keepdims=True)
    return w, explore(w, mask=keep, title="2048").save(
        tmp_path_factory.mktemp("pages") / "big.html")


def allowed_top(w: np.ndarray, row: int) -> int:
    return int(np.argmax(np.where(KEEP[row], w[row], -1.0)))


# -- tests -----------------------------------------------------------------------------------
def test_page_loads_with_no_console_error_and_no_request(browser, small):
    _, path = small
    p = open_page(browser, path)
    p.check_clean()
    assert p.page.inner_text("#title") == "small"
    assert "3 layers × 4 query heads sharing 2 key/value heads" in p.page.inner_text("#facts")
    assert p.page.locator(".thumb").count() == 12
    # Tokens are text, never markup: the <b> token shows its angle brackets.
    assert p.page.inner_text('#qtoks li[data-i="4"]') == "<b>&amp;</b>"
    p.page.close()


def test_clicking_a_thumbnail_opens_its_head(browser, small):
    _, path = small
    p = open_page(browser, path)
    p.page.click('.thumb[data-layer="2"][data-head="3"]')
    p.page.wait_for_function("attnkit.lastRender && attnkit.lastRender.head === 3")
    assert p.eval("[app.dataset.layer, app.dataset.head]") == ["2", "3"]
    assert p.page.inner_text("#selection") == "layer 2 · head 3"
    assert "kv head 1" in p.page.inner_text("#group")  # heads 2-3 share kv head 1
    assert p.page.locator(".thumb.selected").count() == 1
    assert p.page.get_attribute(".thumb.selected", "data-head") == "3"
    p.check_clean()
    p.page.close()


def test_gqa_heads_are_grouped_by_their_kv_head(browser, small):
    _, path = small
    p = open_page(browser, path)
    groups = p.eval("""[...document.querySelectorAll('.layer-row')].slice(1, 2).flatMap(
        (row) => [...row.querySelectorAll('.group')].map(
            (g) => [...g.querySelectorAll('.thumb')].map((b) => +b.dataset.head)))""")
    assert groups == [[0, 1], [2, 3]]
    labels = p.eval("[...document.querySelectorAll('.kvlabel')].map((e) => e.textContent)")
    assert labels == ["kv 0 (heads 0-1)", "kv 1 (heads 2-3)"]
    p.page.close()


def test_keyboard_switches_heads_layers_and_views(browser, small):
    _, path = small
    p = open_page(browser, path)
    where = "[+app.dataset.layer, +app.dataset.head, app.dataset.view]"
    assert p.eval(where) == [0, 0, "lines"]
    for key, want in [("ArrowRight", [0, 1, "lines"]), ("ArrowRight", [0, 2, "lines"]),
                      ("ArrowDown", [1, 2, "lines"]), ("ArrowLeft", [1, 1, "lines"]),
                      ("m", [1, 1, "matrix"]), ("ArrowUp", [0, 1, "matrix"]),
                      ("ArrowUp", [0, 1, "matrix"]), ("l", [0, 1, "lines"])]:
        p.page.keyboard.press(key)
        p.eval("attnkit.rendered")
        assert p.eval(where) == want, key
    assert p.page.is_hidden("#matrix-view") and p.page.is_visible("#lines-view")
    p.check_clean()
    p.page.close()


def test_hovering_a_query_marks_its_top_key(browser, small):
    w, path = small
    p = open_page(browser, path)
    p.page.click('.thumb[data-layer="1"][data-head="2"]')
    p.eval("attnkit.rendered")
    for row in (0, 3, 5, 9, 11):
        p.page.hover(f'#qtoks li[data-i="{row}"]')
        tops = p.eval("[...document.querySelectorAll('#ktoks li.top')].map((e) => +e.dataset.j)")
        assert tops == [allowed_top(w[1, 2], row)], f"query {row}"
        masked = p.eval(
            "[...document.querySelectorAll('#ktoks li.masked')].map((e) => +e.dataset.j)")
        assert masked == np.flatnonzero(~KEEP[row]).tolist()
        assert p.page.inner_text("#tip").startswith(f"query {row} ")
    p.page.mouse.move(5, 700)  # off the tokens: no top key any more
    assert p.page.locator("#ktoks li.top").count() == 0
    p.check_clean()
    p.page.close()


def test_masked_cell_looks_different_from_a_zero_weight(browser, small):
    from matplotlib.image import imread

    w, path = small
    p = open_page(browser, path)
    p.page.keyboard.press("m")
    p.eval("attnkit.rendered")
    assert w[0, 0][ZERO_CELL] == 0 and KEEP[ZERO_CELL] and not KEEP[MASKED_CELL]
    # On the canvas itself (its backing store has p x p pixels per cell) ...
    per_cell = p.eval("document.getElementById('matrix').width") / T
    def canvas_rgb(r, c):
        return tuple(p.eval(f"attnkit.pixel({int((c + .5) * per_cell)}, "
                            f"{int((r + .5) * per_cell)})")[:3])
    zero, masked = canvas_rgb(*ZERO_CELL), canvas_rgb(*MASKED_CELL)
    assert zero == LOW_END
    assert masked[0] == masked[1] == masked[2] and masked != zero  # grey
    # ... and on the screen, as a person sees it.
    shot = imread(io.BytesIO(p.page.locator("#matrix").screenshot()))[..., :3]
    cell = shot.shape[1] / T
    def screen_rgb(r, c):
        return tuple(np.round(shot[int((r + .5) * cell), int((c + .5) * cell)] * 255))
    zero_s, masked_s = screen_rgb(*ZERO_CELL), screen_rgb(*MASKED_CELL)
    assert np.abs(np.subtract(zero_s, LOW_END)).max() <= 2
    assert np.abs(np.subtract(masked_s, zero_s)).max() > 30
    p.check_clean()
    p.page.close()


def test_weights_read_back_from_the_page_equal_the_input(browser, small, tmp_path):
    w, path = small
    p = open_page(browser, path)
    for layer in range(3):
        for head in range(4):
            got = np.array(p.eval(f"attnkit.weights({layer}, {head})")).reshape(T, T)
            half_step = np.broadcast_to(w[layer, head].max(-1, keepdims=True) / 510, (T, T))
            err = np.abs(got - w[layer, head])
            assert np.all(err[KEEP] <= half_step[KEEP] * (1 + 1e-6) + 1e-9), \
                f"layer {layer} head {head}: max error {err[KEEP].max():.3g}"
            assert np.all(got[~KEEP] == 0)
            keep = np.array(p.eval(f"attnkit.mask({layer}, {head})"), bool).reshape(T, T)
            np.testing.assert_array_equal(keep, KEEP)
    p.page.close()
    # float16 pages: within half precision.
    half = explore(w, TOKENS, mask=KEEP, kv_heads=2, precision="float16")
    p = open_page(browser, half.save(tmp_path / "half.html"))
    got = np.array(p.eval("attnkit.weights(2, 1)")).reshape(T, T)
    np.testing.assert_allclose(got[KEEP], w[2, 1][KEEP], rtol=2**-11, atol=2**-24)
    p.check_clean()
    p.page.close()


def test_screenshot_is_not_blank(browser, small, tmp_path, check_png):
    _, path = small
    p = open_page(browser, path)
    p.page.hover('#qtoks li[data-i="5"]')
    p.page.screenshot(path=tmp_path / "lines.png")
    img = check_png(tmp_path / "lines.png")
    # The lines are drawn: the lines canvas holds red pixels.
    box = p.page.locator("#lines").bounding_box()
    area = img[int(box["y"]):int(box["y"] + box["height"]),
               int(box["x"]):int(box["x"] + box["width"]), :3]
    assert ((area[..., 0] > 0.6) & (area[..., 1] < 0.4)).sum() > 50
    p.page.close()


@pytest.mark.alone  # times the page: no other test may share the cores meanwhile
def test_2048_token_matrix_renders_in_under_two_seconds(browser, big, tmp_path, check_png):
    w, path = big
    t0 = time.perf_counter()
    p = open_page(browser, path)
    load_s = time.perf_counter() - t0
    first = p.eval("attnkit.lastRender")
    assert first["view"] == "matrix" and first["ms"] < 2000, first
    # Switching head decodes and draws the other 2048 x 2048 head.
    ms = p.eval("""async () => { const t = performance.now(); await attnkit.select(0, 1);
                   return performance.now() - t; }""")
    assert ms < 2000, f"head switch took {ms:.0f} ms"
    # Hover stays responsive: 200 moves over the matrix, each answered with its cell; the
    # last one at a quarter of the width, half the height: about query 1024, key 512.
    hover = p.eval("""() => {
        const c = document.getElementById('matrix'), r = c.getBoundingClientRect();
        const t = performance.now();
        for (let i = 0; i <= 200; i++) c.dispatchEvent(new MouseEvent('mousemove', {
            clientX: r.left + i / 200 * r.width / 4, clientY: r.top + i / 200 * r.height / 2}));
        return [performance.now() - t, document.getElementById('tip').textContent]; }""")
    assert hover[0] < 400, f"200 hover moves took {hover[0]:.0f} ms"
    m = re.fullmatch(r'query (\d+) "\d+" → key (\d+) "\d+": ([0-9.e+-]+)', hover[1])
    assert m, hover[1]
    row, col, shown = int(m[1]), int(m[2]), float(m[3])
    assert abs(row - 1024) <= 8 and abs(col - 512) <= 8, hover[1]
    assert shown == pytest.approx(float(w[1, row, col]), rel=5e-3,
                                  abs=float(w[1, row].max()) / 510)
    p.page.screenshot(path=tmp_path / "big.png")
    check_png(tmp_path / "big.png")
    p.page.keyboard.press("l")  # the lines view declines 2,048 tokens and says why
    p.eval("attnkit.rendered")
    assert "press m for the matrix" in p.page.inner_text("#lines-note")
    p.check_clean()
    print(f"2048 page: load {load_s:.2f} s, first render {first['ms']:.0f} ms, "
          f"head switch {ms:.0f} ms, 200 hovers {hover[0]:.0f} ms")
    p.page.close()


def test_jupyter_repr_runs_in_an_iframe(browser, small):
    w, _ = small
    page = browser.new_page()
    errors, requests = [], []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.set_content(explore(w[:1], TOKENS, title="inline")._repr_html_())
    frame = page.frame_locator("iframe.attnkit-explorer")
    frame.locator('#app[data-state="ready"]').wait_for(timeout=15_000)
    assert frame.locator("#title").inner_text() == "inline"
    assert frame.locator(".thumb").count() == 4
    assert errors == [] and requests == []
    page.close()


# -- what the page says: axes, the readout, plain words, size, a model's structure ----------
def test_both_axes_say_which_side_is_queries_and_which_keys(browser, small):
    _, path = small
    p = open_page(browser, path)

    def box(selector):
        return p.page.locator(selector).bounding_box()

    # Lines view: "queries" over the query tokens, "keys" over the key tokens.
    q_title, k_title = box("#lines-body .axis-title.q"), box("#lines-body .axis-title.k")
    assert p.page.inner_text("#lines-body .axis-title.q") == "queries"
    assert p.page.inner_text("#lines-body .axis-title.k") == "keys"
    q_col, k_col = box("#qtoks"), box("#ktoks")
    assert q_title["y"] + q_title["height"] <= q_col["y"] + 1
    assert abs((q_title["x"] + q_title["width"]) - (q_col["x"] + q_col["width"])) < 4
    assert k_col["x"] - 1 <= k_title["x"] < k_col["x"] + k_col["width"]
    # Matrix view: keys along the top of the canvas, queries down its left side.
    p.page.keyboard.press("m")
    p.eval("attnkit.rendered")
    canvas, keys, queries = box("#matrix"), box("#mtitle-k"), box("#mtitle-q")
    assert "keys" in p.page.inner_text("#mtitle-k")
    assert "queries" in p.page.inner_text("#mtitle-q")
    assert keys["y"] + keys["height"] <= canvas["y"] and keys["x"] >= canvas["x"] - 1
    assert queries["x"] + queries["width"] <= canvas["x"]
    assert queries["y"] >= canvas["y"] - 1 and queries["height"] > queries["width"]
    p.check_clean()
    p.page.close()


def test_the_readout_sits_beside_the_pointer(browser, small):
    _, path = small
    p = open_page(browser, path)
    p.page.hover('#qtoks li[data-i="7"]')
    tip, token = (p.page.locator(s).bounding_box() for s in ("#tip", '#qtoks li[data-i="7"]'))
    assert p.page.inner_text("#tip").startswith("query 7 ")
    assert abs(tip["y"] - token["y"]) < 40 and abs(tip["x"] - (token["x"] + token["width"])) < 40
    p.page.hover('#ktoks li[data-j="3"]')
    assert p.page.inner_text("#tip").startswith("key 3 ")
    p.page.keyboard.press("m")
    p.eval("attnkit.rendered")
    canvas = p.page.locator("#matrix").bounding_box()
    for fx, fy in ((0.2, 0.3), (0.9, 0.9)):  # also near the corner: it stays on screen
        x, y = canvas["x"] + fx * canvas["width"], canvas["y"] + fy * canvas["height"]
        p.page.mouse.move(x, y)
        tip = p.page.locator("#tip").bounding_box()
        assert p.page.is_visible("#tip") and p.page.inner_text("#tip").startswith("query ")
        near_x = min(abs(tip["x"] - x), abs(tip["x"] + tip["width"] - x))
        near_y = min(abs(tip["y"] - y), abs(tip["y"] + tip["height"] - y))
        assert near_x < 30 and near_y < 30, (tip, x, y)
        assert tip["x"] + tip["width"] <= 1280 and tip["y"] + tip["height"] <= 760
    p.page.mouse.move(2, 2)  # off the matrix: the readout goes away
    assert p.page.is_hidden("#tip")
    p.check_clean()
    p.page.close()


def test_the_header_says_how_exact_the_weights_are_in_plain_words(browser, small, tmp_path):
    w, path = small
    p = open_page(browser, path)
    facts = p.page.inner_text("#facts")
    assert "weights shown to ±0.20% of each row's largest" in facts and "steps" not in facts
    assert "12 queries × 12 keys" in facts
    p.page.close()
    half = explore(w[:1], TOKENS, precision="float16").save(tmp_path / "half.html")
    p = open_page(browser, half)
    assert "half-precision floats (about 3 significant digits)" in p.page.inner_text("#facts")
    assert "1 layer × 4 heads" in p.page.inner_text("#facts")  # no kv heads: plain heads
    p.page.close()


def test_a_small_matrix_is_scaled_up_to_fill_the_pane(browser, tmp_path):
    toks = ["the", "cat", "sat", "on", "the", "mat", "<pad>", "<pad>"]
    keep = an.causal_mask(8, 8)
    w = an.masked_softmax(np.random.default_rng(3).normal(size=(1, 2, 8, 8)), mask=keep)
    path = explore(w, toks, mask=keep, view="matrix").save(tmp_path / "eight.html")
    p = open_page(browser, path, width=1400, height=800)
    canvas, pane = (p.page.locator(s).bounding_box() for s in ("#matrix", "#mscroll"))
    # Before: 40 px a cell at most, 320 px in this pane. Now the limiting side fills it.
    assert canvas["width"] > 320 * 1.5
    assert max(canvas["width"] / pane["width"], canvas["height"] / pane["height"]) > 0.75
    assert canvas["x"] + canvas["width"] <= pane["x"] + pane["width"]
    assert canvas["y"] + canvas["height"] <= pane["y"] + pane["height"]
    p.check_clean()
    p.page.close()


def test_view_of_a_causal_gqa_model_draws_future_keys_as_masked(browser, tmp_path):
    """`attnkit view MODEL --text`: future keys are grey stripes, not white, and the header
    names the key/value heads (a 2-layer Llama, 4 query heads sharing 2 kv heads)."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from attnkit.viz.view import view_file

    words = ["[UNK]", "the", "cat", "sat", "on", "mat"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    config = transformers.LlamaConfig(
        vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=None,
        eos_token_id=None)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "llama")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(
        tmp_path / "llama")
    page = view_file(str(tmp_path / "llama"), tmp_path / "out", text="the cat sat on the mat")
    p = open_page(browser, page)
    assert "4 query heads sharing 2 key/value heads" in p.page.inner_text("#facts")
    p.page.keyboard.press("m")
    p.eval("attnkit.rendered")
    per_cell = p.eval("document.getElementById('matrix').width") / 6

    def rgb(r, c):
        return tuple(p.eval(f"attnkit.pixel({int((c + .5) * per_cell)}, "
                            f"{int((r + .5) * per_cell)})")[:3])

    future = rgb(1, 4)  # query 1 may not see key 4
    assert future[0] == future[1] == future[2] and future != LOW_END  # grey stripes
    keep = np.array(p.eval("attnkit.mask(1, 3)"), bool).reshape(6, 6)
    np.testing.assert_array_equal(keep, an.causal_mask(6, 6))
    p.check_clean()
    p.page.close()
