"""Regenerate the README's pictures of the course in JupyterLab (headless Chromium, as in the browser tests).

    python scripts/screenshots.py            # writes docs/rope_explorer.png, docs/kv_cache_calculator.png
                                             # and, once notebooks/08_*.ipynb exists, docs/loss_curves.png

Needs what the browser tests need: ``pip install playwright`` and Debian's Chromium at /usr/bin/chromium
(``apt-get install -y chromium``; no browser download). JupyterLab serves a throwaway copy of notebooks/; the
lessons' widget cells run live, the widgets are set to a telling state, and each widget's output area is captured.
The loss curves are lesson 08's saved figure from its first ``plot_curves(`` cell (else the last figure
of a cell that mentions "loss"); no training is rerun.
Each PNG is trimmed to its content and kept under 200 KB (a 256-colour palette if needed).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 200_000


def _harness():
    harness = ROOT / "tests" / "course" / "browser" / "lab_harness.py"
    spec = importlib.util.spec_from_file_location("lab_harness", harness)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lab_h = _harness()


def _tidy(path: Path, pad: int = 12) -> int:
    """Trim the empty margin around a screenshot (keeping ``pad`` pixels) and keep it under MAX_BYTES, re-saving
    it with an adaptive 256-colour palette when it is larger."""
    from PIL import Image, ImageChops

    with Image.open(path) as im:
        rgb = im.convert("RGB")
    background = Image.new("RGB", rgb.size, rgb.getpixel((0, 0)))
    box = ImageChops.difference(rgb, background).getbbox()
    if box:
        left, top, right, bottom = box
        rgb = rgb.crop((max(left - pad, 0), max(top - pad, 0), min(right + pad, rgb.width),
                        min(bottom + pad, rgb.height)))
    rgb.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise RuntimeError(f"{path} is {size:,} bytes even with a palette; make the shot smaller")
    return size


def _capture(page, locator, path: Path) -> None:
    page.evaluate("() => document.activeElement && document.activeElement.blur()")  # no focus ring in the shot
    locator.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    locator.screenshot(path=str(path))
    print(f"{path}: {_tidy(path):,} bytes")


def _lesson(root: Path, prefix: str) -> Path | None:
    found = sorted(root.glob(f"{prefix}_*.ipynb"))
    return found[0] if found else None


def rope_explorer(page, lab, root: Path, out: Path) -> None:
    _panel, cells = lab_h.open_and_run_widgets(page, lab, _lesson(root, "03"), kind="lesson")
    explorer = next(c for c in cells["lesson"] if c.locator(".widget-slider").count())
    view = lab_h.widget_view(explorer)
    figure = view.locator(".widget-output")
    for description, presses in (("position", 7), ("pair", 1)):  # a state that shows a turned pair
        slider = lab_h.control(view, "slider", description)
        for _ in range(presses):  # one step at a time, each redraw awaited: the figure is never mid-redraw
            shown = lab_h.wait_until(lambda: lab_h.image_src(figure), what="the figure", page=page)
            target = lab_h.slider_value(slider) + 1
            lab_h.press_on_slider(slider, "ArrowRight")
            lab_h.wait_until(lambda s=slider, t=target: lab_h.slider_value(s) == t, what=description, page=page)
            lab_h.wait_until(lambda old=shown: (src := lab_h.image_src(figure)) and src != old, what="the redraw",
                             page=page)
    page.wait_for_timeout(1500)  # the last redraw may still be on its way
    _capture(page, explorer.locator(".jp-Cell-outputArea"), out / "rope_explorer.png")


def cache_calculator(page, lab, root: Path, out: Path) -> None:
    _panel, cells = lab_h.open_and_run_widgets(page, lab, _lesson(root, "04"), kind="lesson")
    calculator = next(c for c in cells["lesson"] if c.locator(".kv-cache-report").count())
    lab_h.widget_view(calculator)
    _capture(page, calculator.locator(".jp-Cell-outputArea"), out / "kv_cache_calculator.png")


def loss_curves(page, lab, root: Path, out: Path) -> bool:
    lesson = _lesson(root, "08")
    if lesson is None:
        print("no notebooks/08_*.ipynb yet: no loss curves")
        return False
    nb = lab_h.read_notebook(lesson)
    with_plots = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "loss" in c.source.lower()
                  and any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    if not with_plots:
        print(f"{lesson.name} has no saved figure in a cell about the loss: no loss curves")
        return False
    main = [i for i in with_plots if "plot_curves(" in nb.cells[i].source]  # the comparison's curves first
    chosen = main[0] if main else with_plots[-1]
    panel = lab_h.open_notebook(page, lab, lesson.name)
    lab_h.hide_left_sidebar(page)
    image = lab_h.cell(panel, chosen).locator(".jp-OutputArea-output img").last
    image.wait_for()
    _capture(page, image, out / "loss_curves.png")
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the PNGs (default: docs/)")
    args = parser.parse_args(argv)
    reason = lab_h.chromium_missing_reason()
    if reason:
        print(f"cannot take screenshots: {reason}", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modern_block_screenshots_") as tmp:
        root = lab_h.copy_notebooks(ROOT / "notebooks", Path(tmp) / "notebooks")
        with lab_h.JupyterLab(root, Path(tmp) / "server", pythonpath=ROOT) as lab, sync_playwright() as pw:
            browser = lab_h.launch_chromium(pw)
            try:
                for shot in (rope_explorer, cache_calculator, loss_curves):
                    context = browser.new_context(viewport={"width": 1280, "height": 900})
                    lab_h.keep_offline(context, lab)
                    page = context.new_page()
                    page.set_default_timeout(60_000)
                    try:
                        shot(page, lab, root, out)
                    finally:
                        context.close()
            finally:
                browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
