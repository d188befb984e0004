"""report.html in a real browser: Debian's chromium, headless, driven through chromedriver (one session for
the module). It opens from file:// with no error and no request; what it shows equals the rows on disk;
filters, search, permalinks and the comparison find the right tasks; hostile text stays text.

Skipped, with the reason, where chromium and chromedriver are not installed (`make test` installs them
on Debian as root). Timings are printed here and measured against targets by `make bench`."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest

from evalpipe import benchmarks
from evalpipe.devtools import browser as chrome
from evalpipe.devtools import fakeruns
from evalpipe.devtools.fakeruns import HOSTILE
from evalpipe.results import viewer

from . import viewer_outputs as vo
from .conftest import ROOT

VIEWS = benchmarks.sample_views()  # what make report hands the viewer

pytestmark = pytest.mark.e2e

CATEGORY = "Rule System Application"


@pytest.fixture(scope="module")
def browser():
    reason = chrome.unavailable()
    if reason:
        pytest.skip(f"no browser: {reason}")
    with chrome.Browser(1280, 900) as b:
        yield b


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return vo.build(tmp_path_factory.mktemp("viewer-browser"))


@pytest.fixture(scope="module")
def page(outputs, browser):
    viewer.write(outputs, VIEWS)
    return outputs / "report.html"


def show(browser, page, **state) -> None:
    """Open the report at a permalink made of `state`, and wait until it has settled."""
    browser.open(page, urlencode(state))
    browser.run("return 1")  # a new document: the old one's flags are gone once this answers
    browser.idle()


def text(browser, css: str) -> str:
    return browser.run("const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", css)


def count(browser) -> int:
    return int(text(browser, "#count").split(" of ")[0].replace(",", ""))


def clean(browser) -> None:
    assert browser.run("return window.__viewerErrors") == []
    assert browser.run("return window.__viewerViolations") == []
    assert browser.run("return window.__pwned") is None


def samples(outputs, bench, **match):
    out = vo.samples(outputs, bench)
    return [s for s in out if all(s[k] == v for k, v in match.items())]


def test_it_opens_from_disk_with_no_error_and_no_request(browser, page):
    started = time.monotonic()
    show(browser, page)
    print(
        f"\nopen: {time.monotonic() - started:.2f}s wall, page timings {browser.run('return window.__viewerTimings')}"
    )
    clean(browser)
    assert browser.run("return location.protocol") == "file:"
    assert browser.run("return performance.getEntriesByType('resource').map(e => e.name)") == []
    sections = browser.run("return [...document.querySelectorAll('#overview section.bench')].map(s => s.dataset.bench)")
    assert sections == ["clbench", "coin_flip", "error_recovery"]


def test_the_overview_counts_are_the_rows_on_disk(browser, page, outputs):
    show(browser, page)
    shown = browser.run(
        "return [...document.querySelectorAll('section.bench table.runs tbody tr')].map(tr => ["
        "tr.closest('section').dataset.bench, tr.dataset.model, tr.dataset.run,"
        "tr.querySelector('[data-col=answers]').textContent, tr.querySelector('[data-col=judged]').textContent])"
    )
    assert len(shown) == 10
    for bench, model, run, answers, judged in shown:
        folder = outputs / bench / model / f"run-{run}"
        assert int(answers) == len(vo.rows(folder / "infer.jsonl"))
        assert int(judged) == len(vo.rows(folder / "judge.jsonl"))
    # a leaderboard cell shows the aggregate's mean, and leads to the samples behind it
    aggregate = json.loads((outputs / "clbench" / "aggregate.json").read_text())
    alpha = next(m for m in aggregate["models"] if m["model"] == "alpha")
    cell = f"table.leaderboard[data-bench=clbench] tbody tr:nth-child({aggregate['models'].index(alpha) + 1}) "
    cell += f"td[data-figure='{CATEGORY}']"
    assert text(browser, cell).startswith(f"{100 * alpha['figures'][CATEGORY]['mean']:.1f}")
    browser.click(cell)
    browser.idle()
    expected = samples(outputs, "clbench", model="alpha")
    expected = [s for s in expected if s["row"]["metadata"]["context_category"] == CATEGORY]
    assert count(browser) == len(expected)
    assert browser.run("return window.__viewer.state.f1") == CATEGORY
    clean(browser)


def test_filters_and_search_narrow_to_the_right_samples(browser, page, outputs):
    show(browser, page, v="samples")
    total = sum(len(vo.samples(outputs, b)) for b in ("clbench", "coin_flip", "error_recovery"))
    assert count(browser) == total
    browser.select("#filters select[name=b]", "clbench")
    browser.idle()
    assert count(browser) == len(samples(outputs, "clbench"))
    browser.select("#filters select[name=p]", "fail")
    browser.idle()
    failed = [s for s in samples(outputs, "clbench") if s["row"]["score"] != 1]
    assert count(browser) == len(failed)
    browser.select("#filters select[name=m]", "beta")
    browser.idle()
    assert count(browser) == len([s for s in failed if s["model"] == "beta"])
    # judge / parse status, on CoinFlip
    show(browser, page, v="samples", b="coin_flip")
    browser.select("#filters select[name=s]", "unparsed")
    browser.idle()
    assert count(browser) == len([s for s in samples(outputs, "coin_flip") if s["row"]["judge_status"] == "unparsed"])
    # full-text search over the answers, then as a regular expression
    show(browser, page, v="samples")
    browser.type("#filters input[name=q]", f"{vo.MARKER}alpha-3")
    browser.wait(f"window.__viewer.state.q === '{vo.MARKER}alpha-3'")
    browser.idle()
    hits = [s for s in samples(outputs, "coin_flip") if f"{vo.MARKER}alpha-3" in s["row"]["model_output"]]
    assert hits and count(browser) == len(hits)
    browser.run("document.querySelector('#filters input[name=re]').click()")
    browser.clear("#filters input[name=q]")
    browser.type("#filters input[name=q]", f"{vo.MARKER}(alpha|beta)-[01]$")
    browser.wait("window.__viewer.state.re === '1' && window.__viewer.state.q.endsWith('$')")
    browser.idle()
    import re

    pattern = re.compile(f"{vo.MARKER}(alpha|beta)-[01]$", re.I | re.M)
    everything = [s for b in ("clbench", "coin_flip", "error_recovery") for s in vo.samples(outputs, b)]
    # the page searches a sample's texts joined into one (answer first): $ is the end of that or of a line
    assert count(browser) == len([s for s in everything if pattern.search(s["row"]["model_output"])])
    # the prompt is searched too: the long shared context is in two tasks, for every model and run
    browser.run("document.querySelector('#filters input[name=re]').click()")
    browser.clear("#filters input[name=q]")
    browser.type("#filters input[name=q]", "long context start")
    browser.wait("window.__viewer.state.q === 'long context start' && window.__viewer.state.re === ''")
    browser.idle()
    assert count(browser) == 2 * 4
    clean(browser)


def test_a_permalink_restores_filters_and_the_open_sample(browser, page, outputs):
    target = samples(outputs, "clbench", model="beta", run=2)[3]
    state = {"v": "samples", "b": "clbench", "m": "beta", "ob": "clbench", "om": "beta", "or": "2", "ot": target["id"]}
    show(browser, page, **state)
    assert browser.run("return document.querySelector('#filters select[name=m]').value") == "beta"
    assert count(browser) == len(samples(outputs, "clbench", model="beta"))
    assert browser.run("return document.querySelector('#detail [data-sample]').dataset.sample") == target["id"]
    assert browser.run("return document.querySelector('#list .row.sel') !== null")
    # moving on with the keyboard updates the link; the link brings back the same sample
    browser.run("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'j', bubbles: true}))")
    browser.idle()
    moved = browser.run("return window.__viewer.state.ot")
    assert moved != target["id"]
    link = browser.run("return location.href")
    browser.open(page)
    browser.idle()
    browser.run("location.href = arguments[0]; location.reload();", link)
    time.sleep(0.2)
    browser.idle()
    assert browser.run("return document.querySelector('#detail [data-sample]').dataset.sample") == moved
    clean(browser)


def test_clbench_detail_shows_context_rubrics_verdicts_and_error_types(browser, page, outputs):
    first = next(
        s
        for s in samples(outputs, "clbench", model="alpha", run=1)
        if s["row"]["messages"][0]["content"].startswith("LONG CONTEXT START.")
    )
    show(browser, page, v="samples", ob="clbench", om="alpha", **{"or": "1"}, ot=first["id"])
    summary = text(browser, "#detail details.msg summary")
    assert "characters (cut to 20,000 in this report)" in summary and "context shared-long-context" in summary
    browser.run("document.querySelector('#detail details.msg').open = true")
    browser.idle()
    assert text(browser, "#detail details.msg pre").startswith("LONG CONTEXT START.")
    row = first["row"]
    verdicts = browser.run(
        "return [...document.querySelectorAll('#detail ol.rubrics .verdict')].map(v => v.textContent)"
    )
    assert verdicts == row["requirement_status"] and len(verdicts) == len(row["rubrics"])
    assert row["grading_rationale"] in text(browser, "#detail")
    failed = next(s for s in samples(outputs, "clbench", model="alpha", run=1) if s["row"]["score"] == 0)
    analysis = vo.rows(outputs / "clbench" / "alpha" / "run-1" / "error_analysis.jsonl")[failed["id"]]
    show(browser, page, v="samples", ob="clbench", om="alpha", **{"or": "1"}, ot=failed["id"])
    assert ", ".join(analysis["error_types"]) in text(browser, "#detail")
    clean(browser)


def test_coin_flip_and_error_recovery_details(browser, page, outputs):
    row = samples(outputs, "coin_flip", model="beta", run=1)[5]["row"]
    show(browser, page, v="samples", ob="coin_flip", om="beta", **{"or": "1"}, ot=row["idx"])
    cells = browser.run("return [...document.querySelectorAll('#detail table.cf td')].map(td => td.textContent)")
    assert cells[0] == row["target"] and cells[1] == (row["prediction"] or "unparsed") and cells[3] == row["parse_mode"]
    ir = next(s for s in samples(outputs, "error_recovery", run=2) if s["id"].endswith(":IR"))
    problems = (ROOT / "data/error_recovery/sample.jsonl").read_text().splitlines()
    problem = json.loads(problems[ir["row"]["metadata"]["problem"]])
    show(browser, page, v="samples", ob="error_recovery", om="alpha", **{"or": "2"}, ot=ir["id"])
    assert text(browser, "#detail pre mark") == problem["incorrect_step"]
    columns = browser.run("return [...document.querySelectorAll('#detail .cols > div')].map(d => d.dataset.variation)")
    assert columns == ["NR", "CR", "IR"]
    clean(browser)


def test_the_thinking_is_folded_above_the_answer(browser, page, outputs):
    thought = next(s for s in samples(outputs, "coin_flip", model="alpha", run=1) if s["row"]["thinking"])
    row = thought["row"]
    assert row["thinking"].startswith(vo.THINKING) and vo.THINKING not in row["model_output"]
    show(browser, page, v="samples", ob="coin_flip", om="alpha", **{"or": "1"}, ot=row["idx"])
    folded = browser.run(
        "const box = document.querySelector('#detail details.thinking');"
        "const reply = [...document.querySelectorAll('#detail pre.text')].find(p => p.textContent === arguments[0]);"
        "return box && reply && [box.open, box.querySelector('summary').textContent,"
        " !!(box.compareDocumentPosition(reply) & Node.DOCUMENT_POSITION_FOLLOWING)];",
        row["model_output"],
    )
    assert folded == [False, f"Thinking · {len(row['thinking']):,} characters", True]
    browser.run("document.querySelector('#detail details.thinking').open = true")
    browser.idle()
    assert text(browser, "#detail details.thinking pre") == row["thinking"]
    plain = next(s for s in samples(outputs, "coin_flip", model="alpha", run=1) if not s["row"]["thinking"])
    show(browser, page, v="samples", ob="coin_flip", om="alpha", **{"or": "1"}, ot=plain["row"]["idx"])
    assert browser.run("return document.querySelector('#detail details.thinking')") is None
    clean(browser)


def test_hostile_strings_are_shown_as_text_and_run_nothing(browser, page, outputs):
    hostile = [s for s in samples(outputs, "clbench") if any(h in s["row"]["model_output"] for h in HOSTILE[:4])]
    assert len(hostile) >= 3
    rubrics = next(s for s in samples(outputs, "clbench", model="alpha", run=1) if HOSTILE[0] in s["row"]["rubrics"])
    for sample in [*hostile[:4], rubrics]:
        show(
            browser, page, v="samples", ob="clbench", om=sample["model"], **{"or": str(sample["run"])}, ot=sample["id"]
        )
        shown = text(browser, "#detail")
        rubric_texts = [r["rubric_criteria"] if isinstance(r, dict) else r for r in sample["row"]["rubrics"]]
        for piece in (sample["row"]["model_output"], sample["row"]["grading_rationale"], *rubric_texts):
            assert piece in shown
        assert (
            browser.run(
                "return document.querySelectorAll("
                "'#detail img, #detail svg, #detail a, #detail script, #detail iframe').length"
            )
            == 0
        )
        assert browser.run("return document.querySelectorAll('a[href], img:not(.plot), script[src]').length") == 0
        clean(browser)
    # U+2028 and U+2029 arrive as themselves
    sep = next(s for s in samples(outputs, "clbench") if "\u2028" in s["row"]["model_output"])
    show(browser, page, v="samples", ob="clbench", om=sep["model"], **{"or": str(sep["run"])}, ot=sep["id"])
    assert "line\u2028separator\u2029paragraph" in text(browser, "#detail")


def test_compare_puts_the_disagreements_first(browser, page, outputs):
    show(browser, page, v="compare", cb="clbench")
    rates = {}
    for model in vo.MODELS:
        per: dict[str, list[int]] = {}
        for s in samples(outputs, "clbench", model=model):
            per.setdefault(s["id"], []).append(s["row"]["score"])
        rates[model] = {t: sum(v) / len(v) for t, v in per.items()}
    disagree = [t for t in rates["alpha"] if rates["alpha"][t] != rates["beta"][t]]
    assert text(browser, "#cmpsummary [data-count=disagree]") == f"disagree: {len(disagree)}"
    kinds = browser.run("return [...document.querySelectorAll('#cmplist .row')].map(r => r.dataset.kind)")
    assert kinds[: len(disagree)] == ["disagree"] * len(disagree)
    # two runs of one model, from a permalink; the pair opens side by side
    show(browser, page, v="compare", cb="coin_flip", am="alpha", ar="1", bm="alpha", br="2", cf="disagree")
    runs = [{s["id"]: s["row"]["score"] for s in samples(outputs, "coin_flip", model="alpha", run=k)} for k in (1, 2)]
    flips = [t for t in runs[0] if runs[0][t] != runs[1][t]]
    assert browser.run("return document.querySelectorAll('#cmplist .row').length") == len(flips)
    if flips:
        browser.click("#cmplist .row")
        browser.idle()
        assert browser.run("return document.querySelectorAll('#cmpdetail .cols > div').length") == 2
        assert browser.run("return window.__viewer.state.ct") == flips[0] or browser.run(
            "return window.__viewer.state.ct"
        )
    clean(browser)


def test_a_stage_still_writing_is_named(outputs, tmp_path):
    folder = tmp_path / "o" / "coin_flip" / "alpha" / "run-1"
    folder.mkdir(parents=True)
    (folder / "infer.jsonl").write_bytes((outputs / "coin_flip" / "alpha" / "run-1" / "infer.jsonl").read_bytes())
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "evalpipe-judge"])
    try:
        deadline = time.monotonic() + 10
        while b"evalpipe-judge" not in open(f"/proc/{writer.pid}/cmdline", "rb").read():  # until it has started
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (folder / "judge.jsonl.lock").write_text(str(writer.pid))
        _, info = viewer.build(tmp_path / "o", VIEWS)
    finally:
        writer.kill()
        writer.wait()
    assert any(f"being written by a running stage (pid {writer.pid})" in p for p in info["problems"])


def test_a_large_report_stays_virtual_and_quick(browser, tmp_path):
    root = tmp_path / "big"
    data = fakeruns.coin_flip(root, models=4, runs=2, tasks=2500, hostile=True)
    fakeruns.summarise(root, "coin_flip", data)
    started = time.monotonic()
    out = viewer.write(root, VIEWS)
    built = time.monotonic() - started
    started = time.monotonic()
    show(browser, out, v="samples")
    opened = time.monotonic() - started
    assert count(browser) == 20_000
    browser.run("document.getElementById('list').scrollTop = 200000")
    time.sleep(0.2)
    assert browser.run("return document.querySelectorAll('#list .row').length") < 80
    browser.select("#filters select[name=p]", "fail")
    browser.idle()
    failed = 0
    for judge in root.glob("coin_flip/*/run-*/judge.jsonl"):
        failed += sum(1 for r in vo.rows(judge).values() if r["score"] == 0)
    assert count(browser) == failed
    timings = browser.run("return window.__viewerTimings")
    print(
        f"\n20,000 samples: built in {built:.1f}s, {os.path.getsize(out) / 1e6:.1f} MB, opened in {opened:.2f}s wall; "
        f"page: {timings}"
    )
    clean(browser)


def _browser_processes(profile: str) -> dict[int, float]:
    """The processes of the browser with this profile folder, and the CPU seconds each has used."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if profile.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        found[int(pid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return found


def _quiet_within(profile: str, seconds: float) -> bool:
    """Whether the browser's processes use less than a tenth of a core over half a second, before `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        before = _browser_processes(profile)
        time.sleep(0.5)
        after = _browser_processes(profile)
        if sum(after[pid] - before[pid] for pid in after.keys() & before.keys()) < 0.05:
            return True
    return False


def test_a_regex_that_backtracks_for_ever_is_stopped_and_the_page_stays_live(tmp_path):
    """A shared link with `(a+)+$` (exponential backtracking on a run of a's not at a line end): the search runs in
    a worker, the page answers meanwhile, the worker is stopped after its limit, nothing spins, the page searches on."""
    reason = chrome.unavailable()
    if reason:
        pytest.skip(f"no browser: {reason}")
    root = tmp_path / "outputs"
    data = fakeruns.coin_flip(root, models=1, runs=1, tasks=20)
    judged = root / "coin_flip" / "model-0" / "run-1" / "judge.jsonl"
    rows = [json.loads(line) for line in judged.read_text().splitlines()]
    rows[3]["model_output"] = "a" * 40 + "!\nANSWER: YES"  # 2^40 ways for (a+)+ to fail at each start
    judged.write_text("".join(json.dumps(row) + "\n" for row in rows))
    fakeruns.summarise(root, "coin_flip", data)
    viewer.write(root, VIEWS)
    with chrome.Browser(1280, 900) as b:
        profile = b.profile
        b.open(root / "report.html", urlencode({"v": "samples", "q": "(a+)+$", "re": "1"}))  # as the page writes it
        started = time.monotonic()
        assert b.run("return window.__viewerBusy") > 0  # searching, and answering meanwhile
        assert time.monotonic() - started < 2
        b.idle(30)
        assert time.monotonic() - started > 3  # it was stopped by the limit, not done
        assert text(b, "#status").startswith("regular expression stopped after 5 s: it would take too long")
        assert text(b, "#count") == "0 of 20 samples"
        # chromium ends a worker that does not stop of itself within 2 s of terminate() (its forcible delay)
        assert _quiet_within(profile, 6), "the browser still runs the pattern"
        # a new search takes a new worker; the status line is cleared
        b.run("const q = document.querySelector('#filters input[name=q]'); q.value = arguments[0];", "a{40}!$")
        b.run("document.querySelector('#filters input[name=q]').dispatchEvent(new Event('input'))")
        b.wait("window.__viewer.state.q === 'a{40}!$'")
        b.idle()
        assert text(b, "#count") == "1 of 20 samples" and text(b, "#status") == ""
        clean(b)
    assert _browser_processes(profile) == {}
