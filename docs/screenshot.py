"""Retake docs/screenshot.png: the app on the embedded default (`python app.py`), its Generate tab after one generation.

    python docs/screenshot.py [--out docs/screenshot.png]

Needs Debian's chromium (`apt install chromium`) and playwright (requirements.txt), as the browser tests do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a small red circle at the top left and a blue square at the bottom right on a white background"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        parser.error("Debian's chromium is not installed (apt install chromium)")
    from playwright.sync_api import sync_playwright

    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as data_dir:
        proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--data-dir", data_dir], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/"
            deadline = time.time() + 300
            while True:
                try:
                    urllib.request.urlopen(url, timeout=2)
                    break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        raise SystemExit("error: the app did not start")
                    time.sleep(0.5)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(url)
                page.locator("#prompt textarea").wait_for(timeout=120_000)
                page.locator("#prompt textarea").fill(PROMPT)
                page.locator("#generate-button").click()
                page.locator("#image img").wait_for(timeout=120_000)
                page.wait_for_function("(document.querySelector('#generate-info')?.innerText ?? '').includes('seed')",
                                       timeout=120_000)
                page.locator("#heatmap img").wait_for(timeout=120_000)
                time.sleep(1)  # let the feature list and heatmap finish drawing
                page.screenshot(path=args.out)
                browser.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
