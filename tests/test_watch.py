"""The watch (evalpipe/watch.py, docs/watch.md): a served model night after night, through the real command against
the loopback server, a night at a time; and its false-alarm rate on real night files (the real score stage)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from evalpipe import benchmarks, watch
from evalpipe.datasets import subset
from evalpipe.devtools import nights as simulated
from evalpipe.devtools.testserver import Reply
from evalpipe.errors import (
    EXIT_BAD_INPUT,
    EXIT_CHANGED,
    EXIT_INCOMPLETE,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_SPENDING_CAP,
    run_stage,
)
from evalpipe.results import items, nights
from evalpipe.stages import report
from evalpipe.store import lock

from .conftest import ROOT, SAMPLE


def watch_night(env, outputs, night, *settings, timeout=300, runner=True):
    """One start of the crontab line, as cron would run it (runner=False: the watch's module itself, without the
    runner's process in front, which only hands it the words)."""
    command = ["-m", "evalpipe.pipeline", "watch"] if runner else ["-m", "evalpipe.watch"]
    return subprocess.run(
        [sys.executable, *command, "BENCH=coin_flip", "MODEL=m", f"NIGHT={night}"]
        + [f"OUTPUTS={outputs}", "WORKERS=64", *settings],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def verdict_of(outputs, night):
    folder = outputs / "watch" / "coin_flip" / "m" / f"run-{nights.run_number(night)}"
    return json.loads((folder / nights.VERDICT).read_text())


def test_at_most_one_false_alarm_in_twenty_unchanged_nights(tmp_path):
    """Series of 20 nights of a model that does not change (each night answered anew: tasks flip between nights),
    each night compared with the one before by the watch's own comparison, on the real score stage's files: at
    alpha 0.01 a series has at most one night that would exit 8, and over four series (76 comparisons, about 0.8
    false alarms expected) at most 3. `python -m evalpipe.devtools.nights` measures the rate over many series."""
    data = simulated.first_lines(200, tmp_path / "data.jsonl")
    flagged, flipped, paired = [], 0, 0
    for seed in range(4):
        found = simulated.alarms(simulated.nights(tmp_path / f"series-{seed}", data, [0.8] * 20, seed=seed))
        assert len(found) == 19
        flagged.append(sum(1 for a in found if a["flagged"]))
        flipped += sum(a["flipped"] for a in found)
        paired += sum(a["paired"] for a in found)
    assert flipped > 0.1 * paired  # the nights differ as a sampled model's do: the test has noise to resist
    assert flagged[0] <= 1, flagged
    assert sum(flagged) <= 3, flagged


@pytest.mark.e2e
def test_an_eight_point_drop_on_1000_coin_flip_tasks_is_flagged_the_night_it_happens(server, env, tmp_path):
    model = simulated.ServedModel(accuracy=0.8)
    server.handler = model
    data = simulated.first_lines(1000, tmp_path / "coin_flip_1000.jsonl")
    first = watch_night(env, tmp_path / "out", "2026-03-01", f"DATA={data}")
    assert first.returncode == EXIT_OK, first.stderr
    model.night, model.accuracy = "drop", 0.72
    drop = watch_night(env, tmp_path / "out", "2026-03-02", f"DATA={data}")
    assert drop.returncode == EXIT_CHANGED, drop.stdout + drop.stderr
    assert drop.stdout.startswith("watch: coin_flip m 2026-03-02: CHANGED (headline)")
    verdict = verdict_of(tmp_path / "out", "2026-03-02")
    headline = verdict["previous"]["headline"]
    assert headline["n_items"] == 1000 and headline["ci95"][1] < 0 and headline["p_value"] < 0.01
    assert verdict["flagged"] == ["headline"]  # the same served model: only the answers moved
    flips = verdict["previous"]["flips"]
    assert flips["to_fail"] > flips["to_pass"]
    assert f"{flips['to_fail']} pass -> fail" in drop.stdout
    assert "biggest moves of the other figures" in drop.stdout and "Accuracy" in drop.stdout
    link = next(line for line in drop.stdout.splitlines() if line.startswith("Compare the two nights: "))
    assert link.endswith("#v=compare&cb=coin_flip&am=m&ar=20260301&bm=m&br=20260302&cf=disagree")
    assert (tmp_path / "out" / "watch" / "report.html").exists()


@pytest.mark.e2e
def test_quiet_nights_resume_repeat_and_a_re_pointed_snapshot(server, env, tmp_path):
    """SAMPLE=N nights: the first says it has nothing to compare with; an incomplete night exits 3 and the next start
    finishes it; a quiet night prints one line; a later start that night repeats it without a call; the same name
    served by another snapshot with the same accuracy is a served-model change (exit 8); make report shows the
    history."""
    out = tmp_path / "out"
    model = simulated.ServedModel(accuracy=0.8, noise=0.1)
    server.handler = model
    first = watch_night(env, out, "2026-04-01", "SAMPLE=120")
    assert first.returncode == EXIT_OK, first.stderr
    assert first.stdout.count("\n") == 1 and "first night, nothing to compare with yet" in first.stdout
    record = json.loads((out / "watch" / "coin_flip" / "m" / watch.SAMPLE_RECORD).read_text())
    assert record["items"] == 120 and len(record["ids"]) == 120 and record["of_items"] == 3333
    assert "Tracking the coin" not in first.stdout  # the stages' output goes to stderr

    model.night = "2"

    def refusing(request):  # a third of the tasks fail tonight (400: not retried in this run)
        return (
            Reply.error(400, "bad request")
            if simulated._uniform("refuse", request.last_content) < 0.3
            else model(request)
        )

    server.handler = refusing
    incomplete = watch_night(env, out, "2026-04-02", "SAMPLE=120", runner=False)
    assert incomplete.returncode == EXIT_INCOMPLETE, incomplete.stderr
    assert incomplete.stdout == ""
    assert not (out / "watch" / "coin_flip" / "m" / "run-20260402" / nights.VERDICT).exists()
    server.handler = model
    quiet = watch_night(env, out, "2026-04-02", "SAMPLE=120", runner=False)
    assert quiet.returncode == EXIT_OK, quiet.stderr
    assert quiet.stdout.count("\n") == 1 and ": no change. F1 " in quiet.stdout and "vs 2026-04-01" in quiet.stdout
    calls = len(server.chat_requests())
    again = watch_night(env, out, "2026-04-02", "SAMPLE=120", runner=False)
    assert again.returncode == EXIT_OK and again.stdout.startswith(quiet.stdout.rstrip("\n") + " (compared ")
    assert len(server.chat_requests()) == calls

    model.night, model.served = "3", "snapshot-2"
    repointed = watch_night(env, out, "2026-04-03", "SAMPLE=120", runner=False)
    assert repointed.returncode == EXIT_CHANGED, repointed.stdout + repointed.stderr
    assert repointed.stdout.startswith("watch: coin_flip m 2026-04-03: CHANGED (served model)")
    assert "served model (flags the night): snapshot-1 (120) -> snapshot-2 (120)" in repointed.stdout

    history = json.loads((out / "watch" / "coin_flip" / "m" / "history.json").read_text())
    assert [r["night"] for r in history["nights"]] == ["2026-04-01", "2026-04-02", "2026-04-03"]
    assert [r["exit_code"] for r in history["nights"]] == [0, 0, 8]
    assert history["noise"]["night_pairs"] == 1 and history["noise"]["mde"] > 0
    assert run_stage("report", report.main, ["--outputs-dir", str(out)]) in (EXIT_OK, EXIT_INCOMPLETE)  # make report
    page = (out / "report.md").read_text()
    assert "## Watch history: watch/coin_flip/m" in page and "snapshot-2 (120)" in page
    assert "(watch/coin_flip/m/history.csv)" in page
    if importlib.util.find_spec("matplotlib") is not None:  # make report draws the plot (the nights do not wait for it)
        assert "(watch/coin_flip/m/history.png)" in page
        assert (out / "watch" / "coin_flip" / "m" / "history.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.e2e
def test_max_cost_caps_the_night_over_its_starts(server, env, tmp_path):
    model = simulated.ServedModel()
    server.handler = model
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"as_of": "2026-01-01", "models": {"m": {"input": 10.0, "output": 10.0}}}))
    env = {**env, "EVALPIPE_PRICES": str(prices)}
    data = simulated.first_lines(60, tmp_path / "coin_flip_60.jsonl")
    settings = (f"DATA={data}", "MAX_COST=0.04", "ARGS=--max-tokens 16", "WORKERS=4")
    first = watch_night(env, tmp_path / "out", "2026-05-01", *settings, runner=False)
    assert first.returncode == EXIT_SPENDING_CAP, first.stderr
    calls = len(server.chat_requests())
    assert 5 < calls < 60
    second = watch_night(env, tmp_path / "out", "2026-05-01", *settings, runner=False)
    assert second.returncode == EXIT_SPENDING_CAP, second.stderr
    assert len(server.chat_requests()) - calls <= 2  # the night's spending so far counts: no fresh cap per start


def test_bad_settings_and_a_held_lock(tmp_path, capsys):
    out = f"OUTPUTS={tmp_path}"
    for words, said in (
        (["BENCH=coin_flip", "MODEL=m", "NIGHT=2026-13-01", out], "NIGHT=2026-13-01: expected a date"),
        (["BENCH=coin_flip", "MODEL=m", "RUNS=3", out], "RUNS: not a watch setting"),
        (["BENCH=coin_flip", out], "name the model to watch"),
        (["MODEL=m", "NIGHT=2026-01-02", "BASELINE=2026-01-02", out], "choose a night before tonight"),
        (["MODEL=m", "ALPHA=2", out], "ALPHA=2: expected a significance level"),
        (["MODEL=m", "SAMPLE=1", out], "SAMPLE=1: expected a whole number of 2 or more"),
    ):
        assert watch.main(words) == EXIT_BAD_INPUT
        assert said in capsys.readouterr().err
    folder = tmp_path / "watch" / "coin_flip" / "m"
    folder.mkdir(parents=True)
    # a baseline night that never completed: refused before anything runs
    code = watch.main(["BENCH=coin_flip", "MODEL=m", "NIGHT=2026-01-05", "BASELINE=2026-01-01", out])
    assert code == EXIT_BAD_INPUT
    assert "BASELINE=2026-01-01: no complete night of that date" in capsys.readouterr().err
    # another SAMPLE than the watch's subset
    (folder / watch.SAMPLE_RECORD).write_text(json.dumps({"requested": 50}))
    assert watch.main(["BENCH=coin_flip", "MODEL=m", "NIGHT=2026-01-05", "SAMPLE=80", out]) == EXIT_BAD_INPUT
    assert "another SAMPLE starts another watch: give it LABEL=" in capsys.readouterr().err
    # a damaged verdict: one line naming the file, exit 2, no traceback
    (folder / "run-20260105").mkdir()
    (folder / "run-20260105" / nights.VERDICT).write_text('{"night": "2026-01-05", ')
    assert watch.main(["BENCH=coin_flip", "MODEL=m", "NIGHT=2026-01-05", out]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"{folder / 'run-20260105' / nights.VERDICT}: not valid JSON" in err and "Traceback" not in err
    with lock.exclusive(folder / watch.FOLDER):  # a start still running
        assert watch.main(["BENCH=coin_flip", "MODEL=m", "NIGHT=2026-01-05", out]) == EXIT_LOCKED
    assert "is being written by another run" in capsys.readouterr().err


def test_sample_is_stratified_by_category_and_chosen_once(tmp_path):
    bench = benchmarks.get("clbench")
    first = subset.choose(bench, SAMPLE, 6, seed="s")
    assert first == subset.choose(bench, SAMPLE, 6, seed="s")  # the same subset every time it is made
    assert first["stratified_by"] == "category" and first["items"] == 6 and len(first["ids"]) == 6
    strata = first["strata"]
    assert sum(s["chosen"] for s in strata.values()) == 6
    total = sum(s["of"] for s in strata.values())
    for s in strata.values():  # each category its share, within one item
        assert abs(s["chosen"] - 6 * s["of"] / total) < 1
    subset.write(SAMPLE, first["lines"], tmp_path / "subset.jsonl")
    chosen = [t.id for t in bench.load(tmp_path / "subset.jsonl")]
    assert sorted(chosen) == first["ids"]
    # Error Recovery: a problem is an item, taken with its three variations
    recovery = benchmarks.get("error_recovery")
    picked = subset.choose(recovery, recovery.default_data, 3, seed="s")
    assert picked["stratified_by"] == "task" and len(picked["ids"]) == 9 and len(picked["lines"]) == 3


def test_make_watch_hands_its_variables_to_the_runner():
    done = subprocess.run(
        ["make", "-n", "-s", "-C", str(ROOT), "watch", "BENCH=coin_flip", "MODEL=m", "NIGHT=2026-01-01", "SAMPLE=50"]
        + [f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(f"{sys.executable} -m evalpipe.pipeline watch ")
    assert "'NIGHT=2026-01-01'" in line and "'SAMPLE=50'" in line and "'MODEL=m'" in line


def test_a_comparison_within_one_cluster_has_no_interval_instead_of_failing():
    """A small SAMPLE of CL-bench can leave a category's tasks in one context: compared night against night, it has
    no degrees of freedom, so no interval and no p (it used to raise in the t quantile)."""
    figure = benchmarks.get("clbench").figures[1]  # per category

    def night(scores):
        columns = {"keys": ["a", "b"], "clusters": ["ctx", "ctx"], "groups": {"category": ["c", "c"]}}
        return items.ModelItems([{**columns, "columns": {"solved": scores}}], "context_id")  # type: ignore[typeddict-item]

    found = items.compare(night([1, 0]), night([0, 0]), figure, "c", None)
    assert found is not None and found["n_clusters"] == 1 and found["ci95"] is None and found["p_value"] is None


def test_a_changed_dataset_flags_the_night_and_settings_or_prices_are_only_reported(tmp_path):
    data = simulated.first_lines(100, tmp_path / "data.jsonl")
    before, after = simulated.nights(tmp_path / "m", data, [0.8, 0.8])
    for folder, sha, temperature in ((before, "a" * 64, 0.0), (after, "b" * 64, 0.7)):
        # what the watch records when a night starts, and what infer's manifest says
        (folder / nights.DATASET).write_text(json.dumps({"file": str(data), "source_sha256": sha, "revision": None}))
        (folder / "infer.jsonl.manifest.json").write_text(json.dumps({"fingerprint": {"temperature": temperature}}))
    figures = benchmarks.get("coin_flip").figures
    found = nights.compare(figures, nights.Night(before), nights.Night(after), 0.01)
    assert "dataset" in found["flagged"]
    verdict = nights.verdict(figures, after, before, None, 0.01, {"benchmark": "coin_flip", "model": "m", "night": "x"})
    assert verdict["exit_code"] == EXIT_CHANGED
    line = nights.summary_line(verdict)
    assert ": CHANGED (dataset). F1 " in line and line.endswith("; also changed: model settings")
    assert any(c["what"] == "dataset" and "source_sha256=" + "b" * 64 in c["after"] for c in found["changes"])
    settings = nights.changes(
        {"model settings": {"temperature": 0.0}, "price table": {"as_of": "2026-01-01"}, "served model": {"x": 3}},
        {"model settings": {"temperature": 0.7}, "price table": {"as_of": "2026-02-01"}, "served model": {"x": 5}},
    )
    assert [(c["what"], c["flags"]) for c in settings] == [("model settings", False), ("price table", False)]
    assert settings[0]["detail"] == ["temperature: 0.0 → 0.7"]
