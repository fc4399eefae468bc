"""The UI served for real: HTTP API through gradio_client, and headless Chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url():
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("app exited: " + proc.stdout.read()[-3000:])
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


def test_app_binds_to_localhost_only(app_url):
    assert app_url.startswith("http://127.0.0.1:")


def test_generate_through_the_http_api_matches_python(app_url, toy_t2i):
    from gradio_client import Client
    from PIL import Image

    client = Client(app_url, verbose=False)
    prompt = "a small red circle at the top left on a blue background"
    path, info = client.predict(prompt, 1, 5, api_name="/generate")
    served = np.asarray(Image.open(path).convert("RGB"))
    direct = np.asarray(toy_t2i.generate(prompt, steps=1, seed=5)[0])
    assert np.array_equal(served, direct) and "seed 5" in info


@pytest.mark.parametrize("prompt, message", [("", "empty"), ("a red dragon", "dragon")])
def test_bad_input_gives_a_message_and_the_app_stays_usable(app_url, prompt, message):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    with pytest.raises(Exception, match=message) as err:
        client.predict(prompt, 1, 0, api_name="/generate")
    assert "Traceback" not in str(err.value)
    path, _ = client.predict("a blue star", 1, 0, api_name="/generate")
    assert Path(path).exists()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_browser_generates_an_image(app_url):
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(app_url)
        page.locator("#prompt textarea").fill("a large green star in the center on a black background")
        page.locator("#generate-button").click()
        page.locator("#image img").wait_for(timeout=60_000)
        page.wait_for_function("document.querySelector('#generate-info').innerText.includes('seed')",
                               timeout=60_000)
        page.screenshot(path=str(SCREENSHOTS / "generate.png"))
        assert "seed 0" in page.locator("#generate-info").inner_text()
        browser.close()
