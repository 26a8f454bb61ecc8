#!/usr/bin/env python
"""A PNG screenshot of a results site (``kvbench report``) in headless Chromium, e.g. the README's:

    kvbench report results/tiny_grid --out results/tiny_grid/site
    python scripts/site_screenshot.py results/tiny_grid/site --out docs/results_site.png

Opens ``<site>/index.html`` from disk (``make setup-browser`` installs Chromium), fails if the page logs a console
error, optionally sets filters (``--filter question_mode=aware``), picks values of the page's other selects
(``--select pred-run=tiny/tiny_niah/h2o/64L/aware``) and scrolls to a section (``--section budget-plots``), and
writes the viewport as a PNG reduced to ``--colours`` colours (small enough to commit).
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

from PIL import Image

from kvbench.reporting.headless import HeadlessChromium


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("site", help="folder holding the site's index.html")
    parser.add_argument("--out", default="docs/results_site.png")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument(
        "--filter", action="append", default=[], help="KEY=VALUE: set a filter (e.g. question_mode=aware)"
    )
    parser.add_argument(
        "--select",
        action="append",
        default=[],
        help="ID=VALUE: pick VALUE in the page's <select id=ID> (e.g. pred-run=...)",
    )
    parser.add_argument("--section", default=None, help="id of the section to scroll to (e.g. budget-plots)")
    parser.add_argument("--colours", type=int, default=64, help="palette size of the written PNG (0: full colour)")
    args = parser.parse_args(argv)
    with HeadlessChromium(width=args.width, height=args.height) as browser:
        browser.open(Path(args.site) / "index.html")
        for item in args.filter:
            key, _, value = item.partition("=")
            select = f"document.getElementById({json.dumps('filter-' + key)})"
            change = "s.dispatchEvent(new Event('change'))"
            browser.evaluate(f"(() => {{ const s = {select}; s.value = {json.dumps(value)}; {change}; }})()")
        for item in args.select:
            key, _, value = item.partition("=")
            select = f"document.getElementById({json.dumps(key)})"
            change = "s.dispatchEvent(new Event('change'))"
            browser.evaluate(f"(() => {{ const s = {select}; s.value = {json.dumps(value)}; {change}; }})()")
        if args.section:
            browser.evaluate(f"document.getElementById({json.dumps(args.section)}).scrollIntoView()")
        png = browser.screenshot()
        if browser.errors:
            print("console errors:\n  " + "\n  ".join(browser.errors))
            return 1
    image = Image.open(io.BytesIO(png)).convert("RGB")
    if args.colours:
        image = image.quantize(colors=args.colours)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, optimize=True)
    print(f"-> {out} ({out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
