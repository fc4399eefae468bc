"""The UI served for real: one app server for the module, its HTTP API through gradio_client,
and headless Chromium (Debian's /usr/bin/chromium through Playwright) for what a person does."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MODEL = os.environ.get("WORKBENCH_MODEL", "toy")
# The shipped SAEs when there are some; otherwise random SAEs (--saes): the UI's mechanics do not depend
# on what the features mean.
SHIPPED_SAES = "/" not in MODEL and any((ROOT / "saes" / "pretrained" / MODEL).glob("*/cfg.json"))
BROWSER_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
NO_CHROMIUM = "Debian's chromium is not installed (apt install chromium)"
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("workbench-data")


@pytest.fixture(scope="module")
def model():
    import torch

    from interp.models import load_t2i

    torch.set_num_threads(1)
    return load_t2i(MODEL, device="cpu")


@pytest.fixture(scope="module")
def saes_dir(tmp_path_factory, model):
    """None (the shipped SAEs), or a directory of random top-k SAEs on SDXL's four blocks."""
    if SHIPPED_SAES:
        return None
    import torch

    from interp.models.t2i import SDXL_BLOCKS
    from saes.sae import SAE, SAEConfig

    directory = tmp_path_factory.mktemp("random-saes")
    generator = torch.Generator().manual_seed(0)
    for block in SDXL_BLOCKS:
        channels = model.blocks[block].channels
        sae = SAE(SAEConfig("topk", channels, 64, k=4))
        with torch.no_grad():
            sae.W_enc.copy_(torch.randn(channels, 64, generator=generator))
            sae.W_dec.copy_(torch.nn.functional.normalize(sae.W_enc.T.clone(), dim=1))
        sae.save(directory / block)
    return directory


@pytest.fixture(scope="module")
def app_url(data_dir, saes_dir):
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", OMP_NUM_THREADS="1")
    # the app's output goes to a file: a pipe nobody reads fills up and blocks the server mid-test
    log = (data_dir / "app.log").open("w")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--model", MODEL,
                             "--data-dir", str(data_dir)] + (["--saes", str(saes_dir)] if saes_dir else []),
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("app exited: " + (data_dir / "app.log").read_text()[-3000:])
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError("app did not start in 180 s")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def read_image(path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"))


def test_app_binds_to_localhost_only(app_url):
    assert app_url.startswith("http://127.0.0.1:")


def test_generate_through_the_http_api_matches_python(app_url, model):
    prompt = "a small red circle at the top left on a blue background"
    path, info = client(app_url).predict(prompt, 1, 5, api_name="/generate")
    assert np.array_equal(read_image(path), np.asarray(model.generate(prompt, steps=1, seed=5)[0]))
    assert "seed 5" in info


def test_concurrent_clients_each_get_their_own_generation(app_url):
    # Distinct settings: identical outputs served at once race on Gradio's content-hashed cache file.
    settings = [("a large green star in the center on a black background", 1, 3),
                ("a small red circle at the top left on a white background", 1, 11),
                ("a large green star in the center on a black background", 1, 4),
                ("a small red circle at the top left on a white background", 1, 12)]
    alone = [read_image(client(app_url).predict(*s, api_name="/generate")[0]) for s in settings]
    assert not np.array_equal(alone[0], alone[1])
    with ThreadPoolExecutor(4) as pool:  # four sessions at once
        together = list(pool.map(lambda s: read_image(client(app_url).predict(*s, api_name="/generate")[0]),
                                 settings))
    for i, image in enumerate(together):
        assert np.array_equal(image, alone[i])


def test_concurrent_requests_through_one_shared_client_each_get_their_own_images(app_url):
    """One gradio_client (one session) sending several generations at once: each result is its own request's
    (one file per output slot and session let requests swap images, issue 21)."""
    settings = [("a large green star in the center on a black background", 1, seed) for seed in (21, 22, 23, 24)]
    settings += [("a small red circle at the top left on a white background", 1, seed) for seed in (25, 26, 27, 28)]
    alone = [read_image(client(app_url).predict(*s, api_name="/generate")[0]) for s in settings]
    shared = client(app_url)
    for _ in range(3):
        jobs = [shared.submit(*s, api_name="/generate") for s in settings]
        together = [read_image(job.result()[0]) for job in jobs]
        for i, image in enumerate(together):
            assert np.array_equal(image, alone[i]), settings[i]


def test_concurrent_clients_each_get_their_own_paint(app_url):
    block = "mid_block.attentions.0"
    # Four different requests: Gradio caches outputs by content hash, and two identical outputs served at
    # the same moment can race on one cache file (seen as a truncated download), a Gradio matter, not ours.
    requests = [["a large blue square in the center on a white background", 1, seed, block, 0, "", 4.0, "all", None]
                for seed in (0, 1)]
    requests += [["a small yellow triangle at the bottom right on a black background", 1, seed, block, 1, "", -1.0,
                  "all", None] for seed in (7, 8)]
    alone = [[read_image(p) for p in client(app_url).predict(*r, api_name="/paint")[:2]] for r in requests]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda r: [read_image(p) for p in client(app_url).predict(*r, api_name="/paint")[:2]],
                                 requests))
    for i, (original, edited) in enumerate(together):
        assert np.array_equal(original, alone[i][0]) and np.array_equal(edited, alone[i][1])


@pytest.mark.parametrize("prompt, message", [("", "empty"), ("a red dragon", "dragon")])
def test_bad_prompt_gives_a_message_and_the_app_stays_usable(app_url, prompt, message):
    c = client(app_url)
    with pytest.raises(Exception, match=message) as err:
        c.predict(prompt, 1, 0, api_name="/generate")
    assert "Traceback" not in str(err.value)
    path, _ = c.predict("a blue star", 1, 0, api_name="/generate")
    assert Path(path).exists()


def riebench_args(**change):
    from interp.models.t2i import SDXL_BLOCKS

    args = {"category": "change colour", "tasks": ["change-colour-000"], "method": "activation-diff", "k_trans": 3,
            "m": 1.0, "blocks": list(SDXL_BLOCKS), "variant": "static"}
    return list({**args, **change}.values())


def vcl_args(**change):
    args = {"model": "toy-chat", "source": "chat world mixture", "upload": None, "examples": 32, "lambda": 1.0,
            "k": 2, "a": 0.3, "b": 0.7, "sign": "penalize", "pooling": "mean", "steps": 3, "lr": 1e-4, "batch": 8,
            "eval": 2}
    return list({**args, **change}.values())


BAD_INPUTS = [
    ("/riebench", lambda: riebench_args(tasks=[]), "choose at least one task"),
    ("/riebench", lambda: riebench_args(k_trans=0), "less than minimum value 1"),
    ("/riebench", lambda: riebench_args(blocks=[]), "choose at least one block"),
    ("/riebench", lambda: riebench_args(tasks=["change-shape-000"]), "not in the category 'change colour'"),
    ("/riebench", lambda: riebench_args(tasks=["no-such-task"]), "no task with id no-such-task"),
    ("/vcl", lambda: vcl_args(a=0.8, b=0.2), "is empty"),
    ("/vcl", lambda: vcl_args(k=20), "larger than the batch size"),
    ("/vcl", lambda: vcl_args(source="uploaded file"), "upload a file first"),
    ("/flowlens", lambda: [["toy-chat"], "none", "uploaded file", None, 24, 3, False], "upload a file first"),
    ("/flowlens", lambda: [[], "none", "built-in mixture (chat world, held out)", None, 24, 3, False],
     "choose at least one model"),
    ("/diversity", lambda: [None, "both"], "upload a file first"),
]


@pytest.mark.parametrize("endpoint, make_args, message", BAD_INPUTS, ids=[f"{e}:{m}" for e, _, m in BAD_INPUTS])
def test_bad_input_in_any_tab_gives_a_message_not_a_stack_trace(app_url, endpoint, make_args, message):
    with pytest.raises(Exception, match=message) as err:
        client(app_url).predict(*make_args(), api_name=endpoint)
    assert "Traceback" not in str(err.value)


def test_user_errors_are_one_log_line_each_not_a_traceback(app_url, data_dir):
    """Issue 21: the server log printed a full traceback for every user-input error."""
    log = data_dir / "app.log"
    start = log.stat().st_size
    bad = [(["up_blocks.1.attentions.2", 256], "/feature_card"), (["a red circle", 2.5, 0], "/generate"),
           (riebench_args(k_trans=0), "/riebench")]
    for args, endpoint in bad:
        with pytest.raises(Exception):
            client(app_url).predict(*args, api_name=endpoint)
    time.sleep(0.5)
    written = log.read_bytes()[start:].decode("utf-8", "replace")
    assert "Traceback" not in written
    assert written.count("user error") == len(bad)


def test_uploads_are_checked_for_type_and_size(app_url, tmp_path):
    from gradio_client import handle_file

    wrong_type = tmp_path / "prompts.txt"
    wrong_type.write_text("What is two plus two?\n")
    with pytest.raises(Exception, match="jsonl"):
        client(app_url).predict(handle_file(str(wrong_type)), "both", api_name="/diversity")
    too_big = tmp_path / "big.jsonl"
    line = json.dumps({"prompt": "copy these words: apple river", "completion": "apple river"}) + "\n"
    too_big.write_text(line * (2_100_000 // len(line) + 1))  # above the app's 2 MB, below Gradio's 5 MB cap
    with pytest.raises(Exception, match="the limit is 2 MB"):
        client(app_url).predict(handle_file(str(too_big)), "both", api_name="/diversity")


def test_a_typed_file_path_never_reaches_the_file_system(app_url):
    """A client that sends a server path instead of an upload gets an error, not the file's statistics."""
    secret = ROOT / "runs" / "not-an-upload.jsonl"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    try:
        for path in (str(secret), "runs/not-an-upload.jsonl", "/tmp/gradio/../../" + str(secret)):
            body = json.dumps({"data": [{"path": path, "meta": {"_type": "gradio.FileData"}}, "both"]}).encode()
            request = urllib.request.Request(app_url + "gradio_api/call/diversity", body,
                                             {"Content-Type": "application/json"})
            event = json.loads(urllib.request.urlopen(request, timeout=30).read())["event_id"]
            reply = urllib.request.urlopen(f"{app_url}gradio_api/call/diversity/{event}", timeout=60).read().decode()
            assert "event: error" in reply and "tokens" not in reply
    finally:
        secret.unlink()


def raw_call(app_url: str, endpoint: str, data: list) -> str:
    """A raw HTTP call of an endpoint (what a script or a stranger sends): the event stream's text."""
    body = json.dumps({"data": data}).encode()
    request = urllib.request.Request(f"{app_url}gradio_api/call/{endpoint}", body, {"Content-Type": "application/json"})
    event = json.loads(urllib.request.urlopen(request, timeout=30).read())["event_id"]
    return urllib.request.urlopen(f"{app_url}gradio_api/call/{endpoint}/{event}", timeout=120).read().decode()


@pytest.mark.parametrize("endpoint, data, message", [
    ("generate", [{}, 1, 0], "Prompt: expected text, not an object"),
    ("generate", ["a red circle", True, 0], "Steps: true is not a number"),
    ("diversity", [True, "both"], "expected an uploaded file"),
    ("flowlens", [["toy-chat"], "none", "built-in mixture (chat world, held out)", None, 24, 3, "abc"],
     "expected true or false"),
])
def test_a_forged_http_request_gets_a_message_not_a_blank_error(app_url, endpoint, data, message):
    """Issue 41: four forged requests got `{"error": null}`, and `true` as steps or `{}` as a prompt were taken."""
    reply = raw_call(app_url, endpoint, data)
    assert "event: error" in reply and message in reply and '"error": null' not in reply


def test_lexical_diversity_of_an_upload_matches_flowlens(app_url, tmp_path):
    from gradio_client import handle_file

    from flowlens.diversity import lexical_diversity, read_texts

    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": f"copy these words: {a} {b}", "completion": f"{a} {b}"}
            for a, b in [("apple", "river"), ("stone", "cloud"), ("apple", "lamp"), ("tiger", "river")]]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table, info = client(app_url).predict(handle_file(str(data)), "completions", api_name="/diversity")
    served = {name: value for name, value in table["data"]}
    expected = lexical_diversity(read_texts(data, "completions"))
    assert served["texts"] == 4 and served["tokens"] == expected.n_tokens
    assert served["H1"] == pytest.approx(expected.entropy[1], abs=1e-4)
    assert served["distinct-2"] == pytest.approx(expected.distinct[2], abs=1e-4)
    assert "sft.jsonl" in info


def test_flowlens_on_an_uploaded_prompt_file_draws_every_plot(app_url, tmp_path):
    from gradio_client import handle_file

    from zoo.chat.world import World

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": e["prompt"]}) + "\n"
                               for e in World().sample("benign", "held_out", 12)))
    summary, concentration, projections, alignment = client(app_url).predict(
        ["toy-chat"], "toy-chat", "uploaded file", handle_file(str(prompts)), 24, 2, False, api_name="/flowlens")
    assert "**12 prompts**" in summary and "alignment of PC1" in summary
    for plot in (concentration, projections, alignment):
        figure = json.loads(plot["plot"])
        assert figure["data"] and all(len(trace["x"]) == 4 for trace in figure["data"])  # toy-chat has 4 layers
    # a model aligned with itself: |cos| of matched principal directions is 1 at every layer
    self_alignment = json.loads(alignment["plot"])["data"]
    toy = [t for t in self_alignment if t["name"] == "toy-chat: PC1"][0]
    assert np.allclose(toy["y"], 1.0, atol=1e-3)


# ----------------------------------------------------------------------------- in the browser

@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page(browser, app_url):
    """One page (one session) for all browser tests: each opens the tab it needs."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.locator("#prompt textarea").wait_for(timeout=60_000)
    yield page
    page.close()


def wait_until(page, condition: str, timeout_ms: int, watch: str) -> None:
    """Wait for a JavaScript condition; on timeout, keep a screenshot and say what `watch` showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(condition, timeout=timeout_ms)
    except PlaywrightTimeout:
        page.screenshot(path=str(SCREENSHOTS / "failed.png"), full_page=True)
        raise AssertionError(f"timed out waiting for {condition}; {watch} shows: "
                             f"{page.locator(watch).inner_text()!r} (screenshot: artifacts/screenshots/failed.png)")


def text_includes(selector: str, text: str) -> str:
    # null-safe: a tab's widgets are only in the page once the tab has been shown
    return f"(document.querySelector({selector!r})?.innerText ?? '').includes({text!r})"


def shows_brush_colour(page, clip: dict) -> bool:
    """Whether the page shows the Paint tab's magenta brush (#ff00ff) inside `clip` (page coordinates)."""
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(page.screenshot(clip=clip))).convert("RGB")).astype(int)
    red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return bool(((red > 200) & (blue > 200) & (green < 80)).sum() > 20)


PAINTED: dict = {}  # the browser paint test's original, edited and region, for the locality test


def paint_feature() -> tuple[str, int | None]:
    """The Paint tab's default block (the library's last) and the feature to paint there: the shipped
    feature with the best colour label (the block draws colour), else the most frequent (None: random SAEs)."""
    from interp.models.t2i import SDXL_BLOCKS

    if not SHIPPED_SAES:
        return SDXL_BLOCKS[-1], None
    blocks = sorted(p.parent.name for p in (ROOT / "saes" / "pretrained" / MODEL).glob("*/cfg.json"))
    cards_file = ROOT / "saes" / "pretrained" / MODEL / blocks[-1] / "features.json"
    if not cards_file.exists():
        return blocks[-1], None
    cards = json.loads(cards_file.read_text())["features"]
    colours = [c for c in cards if (c.get("label") or "").startswith("colour=")]
    if colours:
        return blocks[-1], max(colours, key=lambda c: c["auroc"])["id"]
    return blocks[-1], max(cards, key=lambda c: c.get("frequency") or 0)["id"]


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def fetch_image(page, selector: str) -> np.ndarray:
    """The exact pixels an <img> shows (fetched by its URL from the page)."""
    from PIL import Image

    src = page.locator(selector).get_attribute("src")
    body = page.request.get(src).body()
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))


@needs_chromium
def test_browser_generates_an_image(page):
    open_tab(page, "Generate and explore")
    page.locator("#prompt textarea").fill("a large green star in the center on a black background")
    page.locator("#generate-button").click()
    page.locator("#image img").wait_for(timeout=60_000)
    wait_until(page, text_includes("#generate-info", "seed"), 60_000, "#generate-info")
    page.screenshot(path=str(SCREENSHOTS / "generate.png"), full_page=True)
    assert "seed 0" in page.locator("#generate-info").inner_text()


@needs_chromium
def test_browser_opens_the_generated_images_first_feature_in_the_features_tab(page):
    """Issue 21: the first heatmap was an unlabelled feature lighting the background, and "open it in the
    Features tab" was only a sentence."""
    open_tab(page, "Generate and explore")
    page.locator("#prompt textarea").fill("a large green star in the center on a black background")
    page.locator("#generate-button").click()
    wait_until(page, text_includes("#feature-text", "feature"), 60_000, "#feature-text")
    chosen = page.locator("#feature-choice input").input_value()
    block, rest = chosen.split(" #")
    feature = int(rest.split(" ")[0])
    if SHIPPED_SAES:
        assert "(" in rest and "unlabelled" not in page.locator("#feature-text").inner_text()  # a labelled one
    page.locator("#generate-open-feature").click()
    wait_until(page, text_includes("#feature-card", f"{block} feature {feature}"), 30_000, "#feature-card")
    assert page.get_by_role("tab", name="Features").get_attribute("aria-selected") == "true"
    assert page.locator("#features-block input").input_value() == block
    assert page.locator("#features-id input").input_value() == str(feature)
    page.wait_for_timeout(1500)  # nothing clears the card it opened (the block set with it)
    assert f"{block} feature {feature}" in page.locator("#feature-card").inner_text()
    assert f"of {block}" in page.locator("#features-summary").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "generate-open-feature.png"), full_page=True)


# Where the RIEBench tab's parts overlap or overflow (issue 21), measured in the page: captions over their
# thumbnails, the table's last column past its edge, the plot's legend beside (not below) its data area.
RIEBENCH_LAYOUT = """() => {
  const box = e => e.getBoundingClientRect();
  const items = [...document.querySelectorAll('#riebench-gallery .thumbnail-item')];
  const covered = items.filter(i => { const img = i.querySelector('img'), cap = i.querySelector('.caption-label');
    return img && cap && box(cap).top < box(img).bottom - 1; }).length;
  const table = document.querySelector('#riebench-table'), heads = [...table.querySelectorAll('th')];
  const last = heads[heads.length - 1];
  const legend = document.querySelector('#riebench-plot .legend');
  const data = document.querySelector('#riebench-plot .nsewdrag');
  return {thumbnails: items.length, covered: covered, overflow: box(last).right - box(table).right,
          legend_below: box(legend).top >= box(data).bottom - 1};
}"""


@needs_chromium
def test_browser_paints_a_feature_edit_in_a_stroked_region(page):
    open_tab(page, "Paint")  # opening the tab loads the image (the toy's one step): strokes must come after it
    wait_until(page, text_includes("#paint-info", "(1 step, seed 0)"), 90_000, "#paint-info")
    # the editor's progress overlay stays a moment after the load's info line: strokes on it are lost
    wait_until(page, "document.querySelector('#paint-canvas .wrap')?.classList.contains('hide') ?? true", 60_000,
               "#paint-canvas")
    canvas = page.locator("#paint-canvas canvas").first
    canvas.wait_for(timeout=60_000)
    # Paint, look at the editor as a user would, and paint again if the stroke is not there (the editor may
    # take a moment more to take strokes on a loaded machine).
    for _ in range(4):
        page.wait_for_timeout(1000)
        box = canvas.bounding_box()
        # the image sits centred in the editor: a short stroke above and left of its centre
        x0, y0 = box["x"] + box["width"] / 2 - 80, box["y"] + box["height"] / 2 - 50
        page.mouse.move(x0, y0)
        page.mouse.down()
        for i in range(1, 11):
            page.mouse.move(x0 + 10 * i, y0, steps=2)
        page.mouse.up()
        page.wait_for_timeout(500)
        if shows_brush_colour(page, {"x": x0 - 10, "y": y0 - 20, "width": 120, "height": 40}):
            break
    else:
        page.screenshot(path=str(SCREENSHOTS / "failed.png"), full_page=True)
        raise AssertionError("the editor never showed the stroke (screenshot: artifacts/screenshots/failed.png)")
    _, feature = paint_feature()
    if feature is not None:
        page.locator("#paint-feature input").fill(str(feature))
    page.locator("#paint-strength input[type=number]").fill("8")
    page.locator("#paint-apply").click()
    wait_until(page, text_includes("#paint-info", "inside the painted region"), 90_000, "#paint-info")
    page.screenshot(path=str(SCREENSHOTS / "paint.png"), full_page=True)
    original, edited = fetch_image(page, "#paint-original img"), fetch_image(page, "#paint-edited img")
    region = fetch_image(page, "#paint-region img")[..., 0] > 0
    assert 0.01 < region.mean() < 0.5, "the stroke should cover part of the image"
    rows, cols = np.nonzero(region)
    assert rows.mean() < region.shape[0] / 2 and cols.mean() < region.shape[1] / 2, "stroked above left of centre"
    assert original.shape == edited.shape and not np.array_equal(original, edited)
    PAINTED.update(original=original, edited=edited, region=region)


def test_painted_edit_changes_the_image_only_inside_the_region():
    if not PAINTED:
        pytest.skip("needs the browser paint test's images")
    original, edited, region = PAINTED["original"], PAINTED["edited"], PAINTED["region"]
    change = np.abs(edited.astype(int) - original.astype(int)).max(axis=-1)
    # The edit acts on the block positions the stroke touches (4 x 4 pixels each at 64 x 64 in the toy's
    # up_blocks.1.attentions.2), and the decoder's convolutions may spread it a little: beyond that margin
    # the change must stay small.
    from scipy.ndimage import binary_dilation

    beyond = ~binary_dilation(region, iterations=8)
    assert change[region].mean() > 2, "the edit should visibly change the painted region"
    assert change[beyond].mean() < change[region].mean() / 2.5


@needs_chromium
def test_browser_browses_a_language_models_sae_cards_in_the_features_tab(page):
    """Issue 19: LM feature cards in the Features tab, the model picked there; the card is the HTML one."""
    open_tab(page, "Features")
    model = page.locator("#features-model input")
    model.click()
    model.fill("toy-chat")
    page.get_by_role("option", name="toy-chat", exact=True).click()
    wait_until(page, text_includes("#features-summary", "of toy-chat"), 60_000, "#features-summary")
    assert page.locator("#features-block input").input_value() == "blocks.1.hook_resid_post"
    assert "promotes" in page.locator("#features-table").inner_text()
    # only what applies to an LM: no Top images gallery, no AUROC sort (its cards have neither images nor labels)
    assert not page.locator("#feature-gallery").is_visible()
    assert "AUROC" not in page.locator("#features-sort").inner_text()
    page.locator("#features-id input").fill("3")
    page.locator("#features-open").click()
    wait_until(page, text_includes("#feature-lm-card", "promotes:"), 30_000, "#feature-lm-card")
    assert "blocks.1.hook_resid_post feature 3 (toy-chat)" in page.locator("#feature-card").inner_text()
    assert page.locator("#feature-lm-card .tok").count() > 0  # the contexts' tokens, shaded by activation
    page.screenshot(path=str(SCREENSHOTS / "features-lm.png"), full_page=True)
    # back to the image model: its blocks and table again
    model.click()
    model.fill("toy")
    page.get_by_role("option", name="toy", exact=True).click()
    wait_until(page, "!document.querySelector('#features-summary').innerText.includes('toy-chat')", 30_000,
               "#features-summary")
    # the card clears in the same event, but Gradio may still show its progress overlay there for a moment
    wait_until(page, "(document.querySelector('#feature-lm-card')?.innerText ?? 'x').trim() === ''", 30_000,
               "#feature-lm-card")
    page.locator("#feature-gallery").wait_for(state="visible", timeout=10_000)
    assert "AUROC" in page.locator("#features-sort").inner_text()


@needs_chromium
def test_browser_refuses_strokes_painted_on_another_prompts_image(page):
    """Issue 41: a stroke drawn, the prompt changed, then Apply put the old mask on the new image. The refusal is
    said where the result was, and the last result's images go (not left under a bare "Error" badge)."""
    if not PAINTED:
        pytest.skip("needs the browser paint test's strokes")
    open_tab(page, "Paint")
    prompt = page.locator("#paint-prompt textarea")
    loaded = prompt.input_value()
    assert page.locator("#paint-edited img").count() == 1  # the earlier Apply's result is shown
    try:
        prompt.fill("a large green star in the center on a black background")
        page.locator("#paint-apply").click()
        wait_until(page, text_includes("#paint-info", "painted on the image of another request"), 60_000,
                   "#paint-info")
        wait_until(page, "document.querySelector('#paint-edited img') === null", 10_000, "#paint-info")
        assert page.locator("#paint-original img").count() == 0
        page.screenshot(path=str(SCREENSHOTS / "paint-stale-strokes.png"), full_page=True)
    finally:
        prompt.fill(loaded)
        for close in page.locator(".toast-close").all():
            close.click()


@needs_chromium
def test_browser_opens_a_feature_card(page):
    open_tab(page, "Features")
    page.locator("#features-id input").fill("0")
    page.locator("#features-open").click()
    wait_until(page, text_includes("#feature-card", "feature 0"), 60_000, "#feature-card")
    page.screenshot(path=str(SCREENSHOTS / "features.png"), full_page=True)
    assert "Label" in page.locator("#feature-card").inner_text()


@needs_chromium
def test_browser_runs_a_two_task_riebench(page):
    open_tab(page, "RIEBench")
    assert page.locator("#riebench-tasks .token").count() == 2  # the category's first two tasks are chosen
    page.locator("#riebench-run").click()
    wait_until(page, text_includes("#riebench-status", "Finished"), 120_000, "#riebench-status")
    status = page.locator("#riebench-status").inner_text()
    assert "2 task(s) edited" in status and "0 failed" in status
    assert page.locator("#riebench-gallery img").count() == 6  # original, edited, target per task
    page.locator("#riebench-plot .js-plotly-plot").wait_for(timeout=30_000)
    assert "all" in page.locator("#riebench-table").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "riebench.png"), full_page=True)
    try:  # a laptop's width, where the last column was 225 px past the table's edge
        page.set_viewport_size({"width": 1100, "height": 1000})
        page.wait_for_timeout(1000)
        layout = page.evaluate(RIEBENCH_LAYOUT)
        page.screenshot(path=str(SCREENSHOTS / "riebench-1100.png"), full_page=True)
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})
    assert layout["thumbnails"] == 6 and layout["covered"] == 0, layout  # every caption under its image
    assert layout["overflow"] <= 1 and layout["legend_below"], layout
    page.locator("#riebench-cancel").click()  # nothing runs: the status must not turn to "Cancelled"
    page.wait_for_timeout(1500)
    assert page.locator("#riebench-status").inner_text() == status


@needs_chromium
def test_browser_cancels_a_riebench_run_within_a_second_and_says_where_it_stopped(page):
    """Issue 21: streamed updates froze the page, the click landed after the end and "Cancelled" stood next to
    every result. Eight tasks: Cancel after the first update; the stop is said at once and is true."""
    import re

    open_tab(page, "RIEBench")
    category = page.locator("#riebench-category input").input_value()  # the first category, chosen
    tasks = page.locator("#riebench-tasks input")
    for i in range(2, 8):
        tasks.fill(f"{category.replace(' ', '-')}-00{i}")
        tasks.press("Enter")
    assert page.locator("#riebench-tasks .token").count() == 8
    # Cancel is clicked from inside the page the moment the first task is reported: a Playwright click is a round
    # trip plus actionability checks, and on CI's faster machine the eight edits once ended before it landed. A
    # page frozen by the stream (the bug) still fails: the observer runs on the page's own thread.
    page.locator("#riebench-cancel").scroll_into_view_if_needed()
    page.evaluate("""() => {
        const observer = new MutationObserver(() => {
            if (!(document.querySelector('#riebench-status')?.innerText ?? '').includes('task(s) done')) return;
            observer.disconnect();
            window.cancelClickedAt = performance.now();
            document.querySelector('#riebench-cancel').click();
        });
        observer.observe(document.body, {childList: true, subtree: true, characterData: true});
    }""")
    page.locator("#riebench-run").click()
    wait_until(page, "window.cancelClickedAt !== undefined", 120_000, "#riebench-status")
    wait_until(page, "document.querySelector('#riebench-status').innerText.includes('Cancel')", 2_000,
               "#riebench-status")
    # "Cancelling…" (or already "Cancelled") within about a second of the click, in the page's own clock
    assert page.evaluate("performance.now() - window.cancelClickedAt") < 2_000
    wait_until(page, text_includes("#riebench-status", "Cancelled"), 10_000, "#riebench-status")
    status = page.locator("#riebench-status").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "riebench-cancel.png"), full_page=True)
    stopped = int(re.search(r"after (\d+) of 8 task", status).group(1))
    assert 1 <= stopped < 8 and "Finished" not in status
    page.wait_for_timeout(1000)
    assert page.locator("#riebench-gallery img").count() == 3 * stopped  # exactly the tasks it says it ran


@needs_chromium
def test_browser_shows_the_message_of_a_bad_feature_id(page):
    """Issue 21: id 256 showed a red "Error" without a message."""
    open_tab(page, "Features")
    page.locator("#features-id input").fill("256")
    page.locator("#features-open").click()
    wait_until(page, "[...document.querySelectorAll('.toast-body')].some(t => t.innerText.includes('0 to 255'))",
               30_000, "body")
    for close in page.locator(".toast-close").all():
        close.click()


@needs_chromium
def test_browser_draws_a_flowlens_plot(page):
    open_tab(page, "FlowLens")
    page.locator("#flowlens-run").click()
    page.locator("#flowlens-concentration .js-plotly-plot").wait_for(timeout=90_000)
    page.locator("#flowlens-projections .js-plotly-plot").wait_for(timeout=30_000)
    assert "48 prompts" in page.locator("#flowlens-summary").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "flowlens.png"), full_page=True)


@needs_chromium
def test_browser_runs_a_few_vcl_steps_and_cancels_cleanly(page):
    open_tab(page, "VCL fine-tuning")
    page.locator("#vcl-steps input").fill("2000")
    page.locator("#vcl-eval input").fill("2")
    # The most steps the form takes, so that on a loaded machine the run cannot end before the click lands (400
    # once did). Cancel in view before the run starts: while the live curves redraw on a loaded machine, a scroll
    # can wait on the renderer longer than a click's 30 s (seen once with a training job beside the suite)
    page.locator("#vcl-cancel").scroll_into_view_if_needed()
    page.locator("#vcl-run").click()
    # VCL_CANCEL_AT_STEP=1500 runs the same check deep into the run, where the loss plot is long (several minutes;
    # not in the suite, whose 20 steps keep it short)
    at_step = int(os.environ.get("VCL_CANCEL_AT_STEP", "20"))
    wait_until(page, f"(m => m !== null && Number(m[1]) >= {at_step})"
               "(document.querySelector('#vcl-status').innerText.match(/step (\\d+) of 2000/))",
               max(120_000, at_step * 1_000), "#vcl-status")
    # Issue 41: the whole loss plot re-sent every 0.3 s froze the page, and Cancel took 39 s to over 120 s to land.
    # Clicked from inside the page (its own clock): "Cancelling" must show within 2 s.
    page.evaluate("""() => {
        const observer = new MutationObserver(() => {
            if (!(document.querySelector('#vcl-status')?.innerText ?? '').includes('Cancel')) return;
            observer.disconnect();
            window.vclCancelSeen = performance.now();
        });
        observer.observe(document.body, {childList: true, subtree: true, characterData: true});
        window.vclCancelAt = performance.now();
        document.querySelector('#vcl-cancel').click();
    }""")
    wait_until(page, "window.vclCancelSeen !== undefined", 10_000, "#vcl-status")
    assert page.evaluate("window.vclCancelSeen - window.vclCancelAt") < 2_000
    wait_until(page, text_includes("#vcl-status", "Cancelled"), 60_000, "#vcl-status")
    status = page.locator("#vcl-status").inner_text()
    stopped_at = int(status.split("at step ")[1].split(" ")[0])
    assert at_step <= stopped_at < 2000
    page.locator("#vcl-curves .js-plotly-plot").wait_for(timeout=30_000)
    assert "(not run)" in page.locator("#vcl-table").inner_text()  # cancelled: no after-training evaluation
    page.screenshot(path=str(SCREENSHOTS / "vcl.png"), full_page=True)


@needs_chromium
def test_browser_circuits_tab_builds_a_graph_shows_a_card_and_intervenes(page):
    """The Circuits tab on the shipped toy-chat transcoders: the graph of the sort example's first answer token is
    drawn, a row of the kept features opens its card, and ablating it shows the real change beside the graph's."""
    open_tab(page, "Circuits")
    page.locator("#circuits-budget input").fill("64")
    page.locator("#circuits-run").click()
    wait_until(page, text_includes("#circuits-status", "Replacement score"), 120_000, "#circuits-status")
    assert "'7'" in page.locator("#circuits-status").inner_text()
    page.locator("#circuits-plot .js-plotly-plot").wait_for(timeout=30_000)
    wait_until(page, text_includes("#circuits-card", "Node"), 30_000, "#circuits-card")
    page.locator('#circuits-table [data-testid="cell-1-0"]').click()
    wait_until(page, "(document.querySelector('#circuits-nodes textarea')?.value ?? '').includes(',')", 30_000,
               "#circuits-nodes")
    page.locator("#circuits-intervene").click()
    wait_until(page, text_includes("#circuits-effects-status", "ablated"), 60_000, "#circuits-effects-status")
    page.screenshot(path=str(SCREENSHOTS / "circuits.png"), full_page=True)
    page.locator("#circuits-nodes textarea").fill("not a node")
    page.locator("#circuits-intervene").click()
    page.get_by_text("is not a feature node of this graph").first.wait_for(timeout=30_000)
