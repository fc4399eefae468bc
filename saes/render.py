"""Feature cards drawn: a feature's heatmap laid over an image (`heatmap_overlay`, also the UI's) and the
self-contained HTML page of a model's cards (`render_html`, written by `saes.features.analyse`)."""

from __future__ import annotations

import base64
import io

import numpy as np

from .probes import AnalysisConfig


def heatmap_overlay(image, heatmap, scale: int = 4, alpha: float = 0.6) -> np.ndarray:
    """The image (H, W, 3) with a feature's heatmap (h, w) laid over it in red, enlarged `scale` times."""
    from PIL import Image

    img = np.asarray(image, dtype=np.float32)
    heat = np.asarray(heatmap, dtype=np.float32)
    peak = float(heat.max())
    heat = heat / peak if peak > 0 else heat
    heat_img = Image.fromarray((heat * 255).astype(np.uint8)).resize((img.shape[1], img.shape[0]), Image.BILINEAR)
    weight = alpha * np.asarray(heat_img, np.float32)[..., None] / 255.0
    red = np.array([255.0, 30.0, 30.0])
    blended = (img * (1 - weight) * 0.7 + img * 0.3 * (1 - weight) + red * weight).clip(0, 255).astype(np.uint8)
    return np.asarray(Image.fromarray(blended).resize((img.shape[1] * scale, img.shape[0] * scale), Image.NEAREST))


def _png_base64(array: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _card_order(cards: list[dict]) -> list[dict]:
    """Live features; labelled ones first by AUROC, then the rest by frequency."""
    live = [c for c in cards if c["frequency"] > 0]
    return sorted(live, key=lambda c: (c["label"] is None, -(c["auroc"] or 0.0), -c["frequency"]))


def render_html(results: dict[str, list[dict]], images: np.ndarray, prompts: list[str], model_name: str,
                summary: dict, config: AnalysisConfig) -> str:
    """A self-contained page: per block, feature cards with heatmap overlays (base64 PNG)."""
    from html import escape

    parts = [f"<!doctype html><meta charset='utf-8'><title>SAE features: {escape(model_name)}</title>",
             "<style>body{font-family:sans-serif;margin:1em}.card{display:inline-block;vertical-align:top;"
             "border:1px solid #ccc;border-radius:6px;margin:4px;padding:6px;width:292px}"
             ".card img{width:64px;height:64px;image-rendering:pixelated;margin:1px}"
             ".label{font-weight:bold}.meta{color:#555;font-size:12px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ddd;padding:2px 6px;font-size:13px}</style>",
             f"<h1>SAE features of {escape(model_name)}</h1>"]
    if summary:
        blocks = list(results)
        parts.append("<h2>Best feature per attribute value (AUROC)</h2><table><tr><th>attribute value</th>"
                     + "".join(f"<th>{escape(b)}</th>" for b in blocks) + "</tr>")
        labels = sorted({label for b in blocks for label in summary.get(b, {})})
        for label in labels:
            row = []
            for b in blocks:
                entry = summary.get(b, {}).get(label)
                row.append(f"<td>#{entry['best_feature']} {entry['best_auroc']:.3f}</td>" if entry else "<td></td>")
            parts.append(f"<tr><td>{escape(label)}</td>{''.join(row)}</tr>")
        parts.append("</table>")
    for block, cards in results.items():
        shown = _card_order(cards)[:config.html_max_features]
        live = sum(c["frequency"] > 0 for c in cards)
        parts.append(f"<h2 id='{escape(block)}'>{escape(block)}</h2><p class='meta'>{len(cards)} features, "
                     f"{live} fire on the pool; showing {len(shown)}</p>")
        for card in shown:
            label = escape(card["label"] or "unlabelled")
            auroc = f", AUROC {card['auroc']:.3f}" if card["auroc"] is not None else ""
            best = "" if card["label"] or card["attribute"] is None else \
                f" (best: {escape(card['attribute'])}={escape(card['value'])})"
            thumbs = []
            for top in card["top_images"][:config.html_images_per_card]:
                overlay = heatmap_overlay(images[top["index"]], top["heatmap"], scale=1)
                title = escape(f"{prompts[top['index']]} | max {top['activation']:.2f}")
                thumbs.append(f"<img title='{title}' src='data:image/png;base64,{_png_base64(overlay)}'>")
            parts.append(f"<div class='card'><div class='label'>#{card['id']} {label}</div>"
                         f"<div class='meta'>freq {card['frequency']:.4f}, mean act {card['mean_activation']:.3f}"
                         f"{auroc}{best}</div>{''.join(thumbs)}</div>")
    return "\n".join(parts)
