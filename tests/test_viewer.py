"""report.html, checked on what it holds: every row on disk, escaped and packed, under a strict CSP, from
damaged folders too. The browser checks (rendering, filters, permalinks, hostile strings) are in
test_viewer_browser.py; everything that can be checked on the file itself is checked here."""

import base64
import gzip
import hashlib
import json
import os
import re
import shutil

import pytest

from evalpipe import benchmarks
from evalpipe.devtools.fakeruns import HOSTILE
from evalpipe.errors import run_stage
from evalpipe.results import viewer
from evalpipe.results.viewer import collect, page
from evalpipe.stages import report as report_stage
from evalpipe.stages import viewer as viewer_stage

from . import viewer_outputs as vo
from .conftest import ROOT

VIEWS = benchmarks.sample_views()  # what make report hands the viewer

BLOCK = re.compile(r'<script type="application/octet-stream" id="(\w+)">([A-Za-z0-9+/=]*)</script>')


def unpack(html: str) -> dict:
    """The report's data as the page decodes it: meta, the index, sample details, shared texts."""
    meta_text = re.search(r'<script type="application/json" id="meta">(.*?)</script>', html, re.S).group(1)
    blocks = {name: json.loads(gzip.decompress(base64.b64decode(data))) for name, data in BLOCK.findall(html)}
    details = [d for n in range(json.loads(meta_text)["sample_chunks"]) for d in blocks[f"s{n}"]]
    texts = [t for n in range(len(json.loads(meta_text)["text_starts"])) for t in blocks[f"x{n}"]]
    return {
        "meta": json.loads(meta_text),
        "index": blocks["ix"],
        "details": details,
        "texts": texts,
        "raw_meta": meta_text,
    }


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return vo.build(tmp_path_factory.mktemp("viewer-outputs"))


@pytest.fixture(scope="module")
def report(outputs):
    html, info = viewer.build(outputs, VIEWS)
    return html, info, unpack(html)


def test_every_row_on_disk_is_in_the_report(outputs, report):
    _, info, data = report
    meta, index = data["meta"], data["index"]
    total = 0
    for bench in meta["benches"]:
        expected = vo.samples(outputs, bench["bench"])
        total += len(expected)
        for run in bench["runs"]:
            folder = outputs / bench["bench"] / run["model"] / f"run-{run['run']}"
            assert run["infer_rows"] == len(vo.rows(folder / "infer.jsonl"))
            assert run["judge_rows"] == len(vo.rows(folder / "judge.jsonl"))
            judged = vo.rows(folder / "judge.jsonl").values()
            assert run["passed"] == sum(r["score"] == 1 for r in judged)
        b = meta["benches"].index(bench)
        assert sum(1 for x in index["b"] if x == b) == len(expected)
    assert len(index["b"]) == len(data["details"]) == info["samples"] == total == meta["samples"]
    # each sample's detail is its own row: the answer and the grade, by task id
    strings = index["strings"]
    for k, detail in enumerate(data["details"]):
        bench = meta["benches"][index["b"][k]]["bench"]
        folder = outputs / bench / meta["models"][index["m"][k]] / f"run-{index['r'][k]}"
        row = vo.rows(folder / "judge.jsonl")[strings[index["i"][k]]]
        assert detail["output"] == row["model_output"]
        assert index["p"][k] == (1 if row["score"] == 1 else 0)


def test_nothing_in_the_data_can_end_its_script_block(report):
    html, _, data = report
    # one meta block, the packed blocks, the page's own script: no data made another
    assert html.count("<script") == 2 + len(BLOCK.findall(html))
    assert "</script" not in data["raw_meta"].lower() and "<!--" not in data["raw_meta"]
    assert "\u2028" not in html and "\u2029" not in html
    # and yet every hostile string survives the round trip, as text
    found = json.dumps(data["details"], ensure_ascii=False) + json.dumps(data["texts"], ensure_ascii=False)
    for hostile in HOSTILE[:6]:
        assert hostile in found or json.dumps(hostile)[1:-1] in found, hostile


def test_script_json_escapes_what_orjson_leaves():
    text = page.script_json({"a": "</script><!-- & \u2028\u2029 >"})
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == {"a": "</script><!-- & \u2028\u2029 >"}


def test_the_page_allows_only_its_own_script_and_style_and_no_network(report):
    html, _, _ = report
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html).group(1)
    script = re.search(r"<script>(.*)</script>\s*</body>", html, re.S).group(1)
    style = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    digest = lambda text: base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()  # noqa: E731
    assert f"script-src 'sha256-{digest(script)}'" in csp
    assert f"style-src 'sha256-{digest(style)}'" in csp
    for directive in (
        "default-src 'none'",
        "connect-src 'none'",
        "img-src data:",
        "require-trusted-types-for 'script'",
    ):
        assert directive in csp
    # nothing to fetch: every src and href is data:, and neither the style nor the script loads anything
    assert all(v.startswith("data:") for v in re.findall(r'\b(?:src|href)="([^"]*)"', html))
    assert "url(" not in style and "@import" not in style
    assert not re.search(r"\b(fetch|XMLHttpRequest|WebSocket|EventSource|sendBeacon|importScripts)\b", script)
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "document.write" not in script


def test_the_same_outputs_give_the_same_bytes(outputs, report):
    assert viewer.build(outputs, VIEWS)[0] == report[0]


def test_a_long_context_is_stored_once_and_cut_visibly(outputs, report, tmp_path, capsys):
    _, info, data = report
    long_texts = [t for t in data["texts"] if t.startswith("LONG CONTEXT START.")]
    assert len(long_texts) == 1  # two tasks × four model-runs share it
    assert "characters not embedded in this report (--context-chars 20,000)" in long_texts[0]
    assert long_texts[0].endswith("LONG CONTEXT END.")  # head and tail are kept
    assert info["cut"]["texts_cut"] == 1 and info["cut"]["chars_omitted"] > 0
    assert data["meta"]["cut"] == info["cut"]
    viewer.write(outputs, VIEWS, tmp_path / "report.html")
    assert any("1 of" in line and "--context-chars all" in line for line in capsys.readouterr().err.splitlines())
    full = unpack(viewer.build(outputs, VIEWS, context_chars=None)[0])
    long_texts = [t for t in full["texts"] if t.startswith("LONG CONTEXT START.")]
    assert len(long_texts) == 1 and len(long_texts[0]) > vo.LONG_CONTEXT_CHARS
    assert full["meta"]["cut"]["texts_cut"] == 0


def test_benchmark_shaped_details(outputs, report):
    _, _, data = report
    meta, index, details = data["meta"], data["index"], data["details"]
    strings = index["strings"]
    by_kind: dict[str, list] = {}
    for k, d in enumerate(details):
        by_kind.setdefault(meta["benches"][index["b"][k]]["kind"], []).append((k, d))
    # CoinFlip: the question alone, out of the template
    k, d = by_kind["coin_flip"][0]
    assert "A coin is heads up." in d["question"] and "ANSWER" not in d["question"]
    # Error Recovery: the given reasoning, the mistaken step's offset, the problem as group
    problems = {
        json.loads(line)["question"]: json.loads(line) for line in (ROOT / "data/error_recovery/sample.jsonl").open()
    }
    irs = [(k, d) for k, d in by_kind["error_recovery"] if strings[index["f2"][k]] == "IR"]
    for k, d in irs:
        source = problems[d["question"]]
        assert d["given"][d["mistake_at"] :] == source["incorrect_step"]
        assert strings[index["g"][k]] == strings[index["i"][k]].rsplit(":", 1)[0]
    # CL-bench: facets, error types from error_analysis.jsonl
    cl = by_kind["clbench"]
    assert {strings[index["f1"][k]] for k, _ in cl} <= set(VIEWS["clbench"].facets) | {
        "Domain Knowledge Reasoning",
        "Rule System Application",
        "Procedural Task Execution",
        "Empirical Discovery & Simulation",
    }
    analysed = [d for _, d in cl if "analysis" in d]
    assert analysed and all(d["analysis"]["error_types"] for d in analysed)
    assert set(meta["error_types"]) <= {"Context Ignored", "Context Misused", "Format Error", "Refusal"}


def test_item_level_figures_and_comparisons_are_used_when_present_and_not_needed(outputs, tmp_path):
    root = tmp_path / "o"
    shutil.copytree(outputs, root)
    path = root / "clbench" / "aggregate.json"
    data = json.loads(path.read_text())
    overall = data["models"][0]["figures"]["Overall"]
    overall["items"] = {"mean": overall["mean"], "se": 0.05, "ci95": [0.1, 0.7], "n_items": 12, "se_method": "x"}
    data["comparisons"] = [{"model": "alpha", "baseline": "beta", "figure": "Overall", "diff": 0.1, "p_value": 0.5}]
    path.write_text(json.dumps(data))
    bench = next(b for b in unpack(viewer.build(root, VIEWS)[0])["meta"]["benches"] if b["bench"] == "clbench")
    assert bench["leaderboard"]["models"][0]["figures"]["Overall"]["items"]["ci95"] == [0.1, 0.7]
    assert bench["leaderboard"]["comparisons"][0]["p_value"] == 0.5
    # an older aggregate.json (no items, no comparisons), and none at all
    for figure in data["models"][0]["figures"].values():
        figure.pop("items", None)
    data.pop("comparisons")
    path.write_text(json.dumps(data))
    bench = next(b for b in unpack(viewer.build(root, VIEWS)[0])["meta"]["benches"] if b["bench"] == "clbench")
    assert "items" not in bench["leaderboard"]["models"][0]["figures"]["Overall"]
    assert bench["leaderboard"]["comparisons"] == []
    path.unlink()
    bench = next(b for b in unpack(viewer.build(root, VIEWS)[0])["meta"]["benches"] if b["bench"] == "clbench")
    assert bench["leaderboard"]["source"] == "score.json"
    assert {m["model"] for m in bench["leaderboard"]["models"]} == set(vo.MODELS)
    assert any("no aggregate.json" in p for p in bench["problems"])


def test_a_damaged_or_unfinished_folder_still_gives_a_report(outputs, tmp_path):
    root = tmp_path / "o"
    shutil.copytree(outputs, root)
    cl = root / "clbench" / "alpha"
    with open(cl / "run-2" / "judge.jsonl", "ab") as f:
        f.write(b'{"idx": "torn-row", "model_output": "half a ro')  # a write cut short
    lines = (root / "coin_flip" / "beta" / "run-1" / "infer.jsonl").read_bytes().split(b"\n")
    lines.insert(3, b"this is not json")
    (root / "coin_flip" / "beta" / "run-1" / "infer.jsonl").write_bytes(b"\n".join(lines))
    no_judge = root / "coin_flip" / "beta" / "run-2"
    (no_judge / "judge.jsonl").unlink()
    (no_judge / "score.json").unlink()
    record = json.loads((no_judge / "infer.jsonl.manifest.json").read_text())
    (no_judge / "infer.jsonl.manifest.json").write_text(json.dumps({**record, "counts": [1]}))  # damaged by hand
    half = root / "clbench" / "beta" / "run-3"  # a run still being written: half its answers, nothing else
    half.mkdir()
    answers = (root / "clbench" / "beta" / "run-1" / "infer.jsonl").read_bytes().split(b"\n")
    answers = [line.decode() + "\n" for line in answers if line]
    (half / "infer.jsonl").write_text("".join(answers[:5]) + answers[5][:40])
    shutil.copy(root / "clbench" / "beta" / "run-1" / "infer.jsonl.manifest.json", half)
    (root / "error_recovery" / "aggregate.json").unlink()

    html, info = viewer.build(root, VIEWS)
    data = unpack(html)
    problems = "\n".join(info["problems"])
    assert "clbench/alpha/run-2/judge.jsonl: the last line is incomplete" in problems
    assert "coin_flip/beta/run-1/infer.jsonl: 1 line(s) are not JSON rows and were skipped (line 4)" in problems
    assert "coin_flip/beta/run-2: no judge.jsonl yet" in problems
    assert "clbench/beta/run-3: no judge.jsonl yet" in problems
    assert "clbench/beta/run-3: 7 of 12 selected tasks have no row on disk yet" in problems
    assert "error_recovery: no aggregate.json" in problems
    meta, index = data["meta"], data["index"]
    runs = {(b["bench"], r["model"], r["run"]): r for b in meta["benches"] for r in b["runs"]}
    assert runs[("coin_flip", "beta", 2)]["judge_rows"] == 0
    assert runs[("coin_flip", "beta", 2)]["samples"] == 20 and runs[("coin_flip", "beta", 2)]["statuses"] == {
        collect.NO_JUDGE: 20
    }
    assert runs[("clbench", "beta", 3)]["samples"] == 5 and runs[("clbench", "beta", 3)]["expected"] == 12
    assert runs[("clbench", "alpha", 2)]["judge_rows"] == 12  # the torn row is not a sample
    assert runs[("coin_flip", "beta", 1)]["infer_rows"] == 20
    ungraded = [p for p in index["p"] if p == -1]
    assert len(ungraded) == 25


def test_a_lock_file_left_by_a_finished_run_is_not_a_writer(outputs, tmp_path):
    root = tmp_path / "o"
    shutil.copytree(outputs / "coin_flip", root / "coin_flip")
    (root / "coin_flip" / "alpha" / "run-1" / "judge.jsonl.lock").write_text(str(os.getpid()))
    _, info = viewer.build(root, VIEWS)
    # this process is not a stage (pytest), as a pid left in the lock file by a finished run (the running
    # case is in test_viewer_browser.py: it starts a process)
    assert not any("being written" in p for p in info["problems"])


def test_the_command_line_writes_the_report_and_says_what_it_holds(outputs, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert run_stage("viewer", viewer_stage.main, [str(outputs), "--output", str(out), "--context-chars", "all"]) == 0
    err = capsys.readouterr().err
    assert f"viewer: wrote {out}" in err and "188 samples" in err and "cut" not in err
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert run_stage("viewer", viewer_stage.main, [str(tmp_path / "empty")]) == 2
    assert "no <bench>/<model>/run-<K>/ folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        viewer_stage.main([str(outputs), "--context-chars", "12"])


def test_make_report_writes_report_html_beside_report_md(outputs, tmp_path):
    root = tmp_path / "outputs"
    shutil.copytree(outputs, root / "nested")
    assert run_stage("report", report_stage.main, ["--outputs-dir", str(root)]) in (0, 3)
    assert (root / "report.md").exists()
    data = unpack((root / "report.html").read_text())
    assert [b["key"] for b in data["meta"]["benches"]] == [
        "nested/clbench",
        "nested/coin_flip",
        "nested/error_recovery",
    ]


def test_the_template_ships_with_the_package():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["evalpipe"]
    for name in ("viewer.html", "viewer.js", "viewer.css"):
        assert (ROOT / "evalpipe" / "results" / "viewer" / name).exists()
        assert any(pattern.endswith(name.rsplit(".", 1)[1]) and "results/viewer" in pattern for pattern in data)
