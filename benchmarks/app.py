"""The UI's overhead: time from launch to ready, and latency of generate (and paint, when the
app has it) through the HTTP API next to the same call made directly in Python, as ratios.

    python -m benchmarks.app [--repeats 10] [--out runs/bench/app.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a small red circle at the top left and a large blue striped star in the center on a white background"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="runs/bench/app.json")
    args = parser.parse_args()
    import torch
    from gradio_client import Client

    from interp.models import load_t2i

    torch.set_num_threads(1)
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        while True:
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() - start > 300:
                    raise SystemExit("the app did not start")
                time.sleep(0.1)
        ready_s = time.perf_counter() - start
        client = Client(url, verbose=False)
        model = load_t2i("toy", device="cpu")
        http = median_time(lambda: client.predict(PROMPT, 1, 0, api_name="/generate"), args.repeats)
        direct = median_time(lambda: model.generate(PROMPT, steps=1, seed=0), args.repeats)
        result = {"launch_to_ready_s": ready_s, "generate_http_s": http, "generate_python_s": direct,
                  "generate_ui_overhead_ratio": http / direct}
        api = client.view_api(return_format="dict", print_info=False)
        if "/paint" in api.get("named_endpoints", {}):
            from app import Workbench
            from ui.paint import PaintTab

            paint = PaintTab(Workbench("toy"))
            request = paint.benchmark_request()
            http_p = median_time(lambda: client.predict(*request, api_name="/paint"), args.repeats)
            direct_p = median_time(lambda: paint.paint(*request), args.repeats)
            result |= {"paint_http_s": http_p, "paint_python_s": direct_p, "paint_ui_overhead_ratio": http_p / direct_p}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for key, value in result.items():
        print(f"{key:28s} {value:.4g}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
