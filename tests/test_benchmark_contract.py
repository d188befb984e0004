"""Every registered benchmark keeps the contract: load → solve → grade → metrics, in process, against the
loopback server answering with the benchmark's own example replies. A new benchmark is checked here
by registering it; nothing in this file names one."""

import asyncio
import json
import math

import pytest

from evalpipe import benchmarks, cli
from evalpipe.benchmarks import ErrorAnalysis
from evalpipe.benchmarks.base import select, uses_judge_model
from evalpipe.client.llm import ChatClient, Endpoint
from evalpipe.devtools.fakes import sample_rows
from evalpipe.devtools.testserver import FakeOpenAI, example_replies
from evalpipe.results import figures, items
from evalpipe.stages import score
from evalpipe.store import jsonl
from evalpipe.store.checkpoint import StepCache

from .conftest import API_KEY

NAMES = list(benchmarks.REGISTRY)


@pytest.fixture(params=NAMES)
def case(request, tmp_path):
    bench = benchmarks.get(request.param)
    server = FakeOpenAI(example_replies(bench)).start()
    data = tmp_path / "data.jsonl"
    data.write_bytes(b"".join(jsonl.dumps(row) + b"\n" for row in sample_rows(bench, 6)))
    yield bench, server, data, tmp_path
    server.stop()


def run_through(bench, server, data, tmp_path, n=4):
    """The stages' calls, in process: load, select, solve n tasks, grade them, score the run."""
    tasks = list(select(bench, bench.load(data), None))

    async def go():
        endpoint = Endpoint(model="m", base_url=server.base_url, api_key=API_KEY, timeout=5, max_retries=1)
        model = ChatClient(endpoint)
        steps = StepCache(tmp_path / "infer.jsonl")
        try:
            answers = [await bench.solve(task, model, steps) for task in tasks[:n]]
            judge = model if uses_judge_model(bench) else None
            return answers, [await bench.grade(row, judge) for row in answers], model
        finally:
            steps.close()

    answers, graded, _ = asyncio.run(go())
    kept = {row["idx"]: {k: row[k] for k in (*bench.score_fields, "judge_status") if k in row} for row in graded}
    return tasks, answers, graded, score.summarize(bench, tasks, kept)


def test_load_gives_distinct_stable_ids(case):
    bench, _, data, _ = case
    first, again = list(bench.load(data)), list(bench.load(data))  # a list, or read as it goes
    assert len(first) >= 4 and len({t.id for t in first}) == len(first)
    assert [t.id for t in first] == [t.id for t in again]
    assert [t.id for t in select(bench, first, 2)] == [t.id for t in select(bench, again, 2)]  # a prefix keeps its ids


def test_solve_grade_metrics_against_the_server(case):
    bench, server, data, tmp_path = case
    tasks, answers, graded, metrics = run_through(bench, server, data, tmp_path)
    ids = [t.id for t in tasks[:4]]
    assert [row["idx"] for row in answers] == ids and [row["idx"] for row in graded] == ids
    assert all(row.get("status") == "ok" and row.get("model") == "m" for row in answers)
    assert all(row["score"] in (0, 1) and isinstance(row["judge_status"], str) for row in graded)
    # the fake replies are what a well-formed reply looks like: every one is read as such (the test server, chaos
    # runs and a new benchmark's first run by hand rely on it)
    assert [row["judge_status"] for row in graded] == ["ok"] * 4, [row["judge_status"] for row in graded]
    json.dumps(answers), json.dumps(graded)  # rows are plain JSON
    cov = metrics["coverage"]
    assert (cov["expected"], cov["graded"], cov["missing"]) == (len(tasks), 4, len(tasks) - 4)
    assert sum(metrics["judge_status"].values()) == 4
    shown = figures.headline(bench.figures, metrics)
    assert shown and all(v is None or (-1 <= v <= 1 and not math.isnan(v)) for v in shown.values())
    text = bench.format_metrics(metrics)
    assert isinstance(text, str) and str(cov["expected"]) in text
    assert server.requests  # the calls really went over the wire


def test_each_figure_is_declared_once(case):
    """Every declared figure lands on the leaderboard (the headline or its table), from columns the benchmark
    writes, and its value in score.json is the ratio its item-level estimate makes of the run's items."""
    bench, server, data, tmp_path = case
    tasks, _, graded, metrics = run_through(bench, server, data, tmp_path)
    kept = {row["idx"]: row for row in graded}
    columns = bench.item_columns(tasks, kept)
    n = len(columns["keys"])
    assert n and len(set(columns["keys"])) == n
    assert all(len(values) == n for values in columns["columns"].values())
    assert all(len(labels) == n for labels in columns["groups"].values())
    assert columns["clusters"] is None or len(columns["clusters"]) == n
    assert any(v is None for values in columns["columns"].values() for v in values)  # ungraded tasks stay None
    json.dumps(columns)
    model = items.ModelItems([columns], bench.prefix_group)
    shown = figures.tables(bench.figures, metrics)
    compared = 0
    for figure in bench.figures:
        for name, label in model.subsets(figure):
            assert name in shown.get(figure.table, {}), (figure, name)
            got = items.estimate(model, figure, label, None)
            assert got["mean"] is None or -1 <= got["mean"] <= 1
            if figure.run is None and got["mean"] is not None:  # `run`: the reference's own formula for the run
                assert shown[figure.table][name] == pytest.approx(got["mean"], abs=1e-12), (figure, name)
                compared += 1
    assert compared


def test_prompts_and_options_are_stable(case):
    bench, *_ = case
    other = type(bench)()
    assert bench.prompts() == other.prompts()
    assert type(bench)(bench.options).options == bench.options


def test_options_round_trip_through_the_flags(case):
    bench, *_ = case
    for stage, add_args in (("infer", _infer_args), ("judge", _judge_args)):
        argv = ["--bench", bench.name, "--model", "m"]
        rebuilt, args = cli.parser_for(stage, "", add_args, argv)
        assert rebuilt.options == bench.options  # the defaults of the flags are the options' defaults


@pytest.mark.parametrize("case", [n for n in NAMES if isinstance(benchmarks.get(n), ErrorAnalysis)], indirect=True)
def test_error_analysis_capability(case):
    bench, server, data, tmp_path = case
    tasks, _, graded, _ = run_through(bench, server, data, tmp_path, n=len(list(bench.load(data))))
    failed = [row for row in graded if bench.needs_error_analysis(row)]
    assert failed, "the example replies should fail some tasks"

    async def go():
        judge = ChatClient(Endpoint(model="j", base_url=server.base_url, api_key=API_KEY, timeout=5, max_retries=1))
        return [await bench.analyze_error(row, judge) for row in failed]

    analyses = {row["idx"]: row for row in asyncio.run(go())}
    assert all(bench.is_analyzed(row) for row in analyses.values())
    judged = {row["idx"]: row for row in graded}
    figures = bench.error_analysis_metrics(tasks, judged, analyses)
    assert json.dumps(figures)


def _infer_args(parser, bench):
    from evalpipe.stages import infer

    infer._add_args(parser, bench)


def _judge_args(parser, bench):
    from evalpipe.stages import judge

    judge._add_args(parser, bench)
