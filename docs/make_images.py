"""Regenerate the docs' figures in ``docs/_static/images/`` from real runs (``make docs-images``).

- ``loss_vs_dup.png``, ``loss_vs_step.png``: the plots of a ``make demo`` run (``python -m pretrain_exp``), copied
  from its ``plots/``;
- ``continue_loss_vs_step.png``: the same plot of the demo run continued for as many steps again without
  insertions (``python -m pretrain_exp parent=<the demo run>``: the forgetting curve);
- ``inspect_html.png``: the stream inspector's HTML view of step 2, row 4 of an ``experiment=tiny`` run
  (``python -m pretrain_exp.inspect <run> step=2 row=4 --html page.html``), rendered by a headless Chromium
  (Debian: ``apt-get install chromium``; without one the other figures are still made and the command says so).

Runs are made in a temporary runs root unless ``--demo-run`` / ``--tiny-run`` name finished ones. Every image is
kept under 200 KB (resized, then palette-quantized if needed).

    python docs/make_images.py [--demo-run DIR] [--tiny-run DIR] [--child-run DIR] [--out docs/_static/images]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
MAX_BYTES = 200_000
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def run_experiment(runs: Path, *overrides: str) -> Path:
    """``python -m pretrain_exp <overrides>`` under the runs root ``runs``; returns its run dir (the last line)."""
    env = {**os.environ, "PRETRAIN_EXP_RUNS": str(runs), "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "pretrain_exp", "wandb=disabled", *overrides], cwd=runs, env=env,
                         stdout=subprocess.PIPE, text=True, check=True)
    print(out.stdout, end="")  # the run's table: the numbers the figures show
    last = [line for line in out.stdout.splitlines() if line.startswith("run dir: ")][-1]
    return Path(last[len("run dir: "):])


def save_small(src: Path, dest: Path, width: int = 900, trim: bool = False) -> None:
    """``src`` as a PNG of at most ``width`` pixels and :data:`MAX_BYTES` bytes at ``dest`` (``trim``: without the
    white margin below and right of the content, a screenshot's empty viewport)."""
    from PIL import Image, ImageChops, ImageOps

    img = Image.open(src).convert("RGB")
    if trim:
        box = ImageChops.difference(img, Image.new("RGB", img.size, "white")).getbbox()
        if box:
            img = ImageOps.expand(img.crop((0, 0, box[2], box[3])), border=(0, 0, 12, 12), fill="white")
    if img.width > width:
        img = img.resize((width, round(img.height * width / img.width)), Image.LANCZOS)
    img.save(dest, optimize=True)
    if dest.stat().st_size > MAX_BYTES:
        img.quantize(colors=128).save(dest, optimize=True)
    if dest.stat().st_size > MAX_BYTES:
        raise SystemExit(f"error: {dest}: {dest.stat().st_size} bytes, over {MAX_BYTES}")
    print(f"wrote {dest} ({dest.stat().st_size:,} bytes)")


def screenshot(html: Path, png: Path) -> bool:
    """Render ``html`` with a headless Chromium into ``png``; False when no browser is installed."""
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print("note: no headless Chromium (apt-get install chromium): the inspector screenshot is not regenerated")
        return False
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", "--window-size=1000,560", f"--screenshot={png}",
                        html.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    return png.is_file()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-run", type=Path, help="a finished `make demo` run dir (default: run the demo)")
    parser.add_argument("--tiny-run", type=Path, help="a finished experiment=tiny run dir (default: run it)")
    parser.add_argument("--child-run", type=Path, help="a finished run continuing the demo run (parent=<demo run>; "
                        "default: run it)")
    parser.add_argument("--out", type=Path, default=DOCS / "_static" / "images")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        tiny = args.tiny_run or run_experiment(runs, "experiment=tiny")
        html, png = runs / "inspect.html", runs / "inspect.png"
        subprocess.run([sys.executable, "-m", "pretrain_exp.inspect", str(tiny), "step=2", "row=4", "--html",
                        str(html)], check=True, stdout=subprocess.DEVNULL)
        if screenshot(html, png):
            save_small(png, args.out / "inspect_html.png", width=1000, trim=True)
        demo = args.demo_run or run_experiment(runs)
        for name in ("loss_vs_dup", "loss_vs_step"):
            save_small(demo / "plots" / f"{name}.png", args.out / f"{name}.png")
        child = args.child_run or run_experiment(runs, f"parent={demo}")
        save_small(child / "plots" / "loss_vs_step.png", args.out / "continue_loss_vs_step.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
