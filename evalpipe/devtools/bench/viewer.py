"""`make bench`'s viewer part: report.html for 100,000 CoinFlip samples and for 3 runs × 2 models of a
1,899-task CL-bench-shaped set, built, then opened, filtered and searched in headless chromium.

    python -m evalpipe.devtools.bench.viewer [--tiny]
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ... import benchmarks
from ...results import viewer
from .. import browser as chrome
from .. import fakeruns
from .report import Figure


def measure(page: Path, query: str) -> dict:
    """Seconds (wall, as a user waits) to open the report, show the samples, filter, search twice."""
    out: dict = {}
    with chrome.Browser(1280, 900) as b:
        started = time.monotonic()
        b.open(page)
        b.idle(300)
        out["open"] = time.monotonic() - started
        out["page"] = b.run("return window.__viewerTimings")
        started = time.monotonic()
        b.click("#tabs button[data-view=samples]")
        b.idle(300)
        out["list"] = time.monotonic() - started
        started = time.monotonic()
        b.select("#filters select[name=p]", "fail")
        b.idle(300)
        out["filter"] = time.monotonic() - started
        out["failed"] = b.run("return window.__viewer.count()")
        out["filter_page"] = b.run("return window.__viewerTimings.last_filter_ms") / 1000
        for n, q in enumerate((query, query + " the")):
            b.run("const q = document.querySelector('#filters input[name=q]'); q.value = arguments[0];", q)
            started = time.monotonic()
            b.run("document.querySelector('#filters input[name=q]').dispatchEvent(new Event('input'))")
            b.wait("window.__viewer.state.q === arguments[0] && window.__viewerBusy === 0", 300, q)
            out[f"search{n}"] = time.monotonic() - started - 0.2  # less the typing debounce
        b.run("document.getElementById('list').scrollTop = 1e7")
        time.sleep(0.2)
        out["nodes"] = b.run("return document.querySelectorAll('*').length")
        out["errors"] = b.run("return window.__viewerErrors")
    return out


def one(name: str, root: Path, query: str, context_chars: int | None = viewer.DEFAULT_CONTEXT_CHARS) -> list[Figure]:
    started = time.monotonic()
    html, info = viewer.build(root, benchmarks.sample_views(), context_chars)
    built = time.monotonic() - started
    page = root / "report.html"
    page.write_text(html)
    size = os.path.getsize(page) / 1e6
    rows: list[Figure] = [
        Figure(
            f"viewer {name}: build report.html",
            f"{built:.1f} s, {size:.1f} MB",
            "<= 60 s, <= 100 MB",
            built <= 60 and size <= 100,
        )
    ]
    reason = chrome.unavailable()
    if reason:
        return rows + [Figure(f"viewer {name}: in a browser", f"skipped: {reason}", "reported", True)]
    m = measure(page, query)
    # same shape Figure after Figure on purpose: one row a figure with its own reference, as make bench prints them
    rows += [
        Figure(
            f"viewer {name}: open from file:// until ready",
            f"{m['open']:.2f} s (index decoded in {m['page']['index_ms'] / 1000:.2f} s)",
            "<= 3 s",
            m["open"] <= 3,
        ),
        Figure(f"viewer {name}: show the sample list", f"{m['list']:.2f} s", "<= 1 s", m["list"] <= 1),
        Figure(
            f"viewer {name}: filter to failed samples (a real click)",
            f"{m['filter']:.2f} s, of which filtering {m['filter_page']:.3f} s ({m['failed']:,} shown)",
            "<= 1 s",
            m["filter"] <= 1,
        ),
        Figure(
            f"viewer {name}: first full-text search (builds the text index)",
            f"{m['search0']:.2f} s",
            "<= 5 s",
            m["search0"] <= 5,
        ),
        Figure(f"viewer {name}: next search", f"{m['search1']:.2f} s", "<= 1 s", m["search1"] <= 1),
        Figure(
            f"viewer {name}: elements in the page, list scrolled to the end",
            f"{m['nodes']:,}{' (page errors: ' + str(m['errors']) + ')' if m['errors'] else ''}",
            "<= 3,000, no page error",
            m["nodes"] <= 3000 and not m["errors"],
        ),
    ]
    return rows


def figures(work: Path, tiny: bool) -> list[Figure]:
    """The viewer's rows of `make bench`: both sets built under `work`, then removed."""
    rows: list[Figure] = []
    cf = work / "viewer-coin-flip"
    models, runs, tasks = (2, 1, 1000) if tiny else (5, 2, 10_000)
    data = fakeruns.coin_flip(cf, models=models, runs=runs, tasks=tasks)
    fakeruns.summarise(cf, "coin_flip", data)
    rows += one(f"CoinFlip {models * runs * tasks:,} samples", cf, "coin value")
    shutil.rmtree(cf)
    cl = work / "viewer-clbench"
    models, runs, tasks, contexts, chars = (1, 1, 100, 20, 4000) if tiny else (2, 3, 1899, 500, 40_000)
    data = fakeruns.clbench_outputs(cl, models=models, runs=runs, tasks=tasks, contexts=contexts, context_chars=chars)
    fakeruns.summarise(cl, "clbench", data)
    name = f"CL-bench-shaped {runs} runs × {models} models × {tasks:,} tasks"
    rows += one(name, cl, "policy clause")
    rows += one(name + ", --context-chars all", cl, "policy clause", context_chars=None)
    shutil.rmtree(cl)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evalpipe.devtools.bench.viewer", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tiny", action="store_true", help="toy sizes: every step runs in seconds")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="evalpipe-bench-viewer-") as tmp:
        rows = figures(Path(tmp), args.tiny)
    for row in rows:
        print(row.line())
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
