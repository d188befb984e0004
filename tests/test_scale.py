"""Shards on schedulers (docs/scale.md): the Kubernetes Indexed Job's container command run as four processes at
once, one killed with SIGKILL and run again; the Slurm array script submitted with `--array=0-3` to a throwaway
single-node cluster, one task cancelled mid-run and requeued. Either way the merged run scores as an uncut run
of the same tasks, every task has one row, and no task was asked again but those in flight when one was
stopped. Plus the cases around them: resume across cuts, shard files of another count, the shard from the
environment."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from evalpipe import benchmarks
from evalpipe.devtools.testserver import FakeOpenAI
from evalpipe.errors import BadInput
from evalpipe.results.viewer import collect
from evalpipe.store import paths, shards

from .conftest import API_KEY, ROOT, SAMPLE, Stage, is_judge, scripted

DOC = ROOT / "docs" / "scale.md"
TASKS = 32  # in 8 contexts of 4, two to each of the 4 shards
SHARDS = 4
WORKERS = 2
DELAY = 0.2  # seconds a call takes on the slow server: a shard's stage lasts about a second
TASK_MARK = re.compile(r"\[(task-\d\d)\]")


def dataset(path: Path) -> None:
    """CL-bench rows from the sample, made distinct: task-00..31, context-00..07 (4 tasks each)."""
    sample = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    rows = []
    for i in range(TASKS):
        row = json.loads(json.dumps(sample[i % len(sample)]))
        row["metadata"].update(task_id=f"task-{i:02d}", context_id=f"context-{i // 4:02d}")
        row["messages"][-1]["content"] += f" [task-{i:02d}]"
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


class Slow:
    """conftest's scripted answers, each after `delay` seconds."""

    delay = 0.0

    def __call__(self, request):
        return replace(scripted(request), delay=self.delay)


@pytest.fixture(scope="module")
def endpoint():
    slow = Slow()
    server = FakeOpenAI(slow).start()
    yield server, slow
    server.stop()


def base_env(server) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "JUDGE_", "SLURM_", "JOB_COMPLETION"))}
    env.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY=API_KEY, PYTHONUNBUFFERED="1")
    return env


def runner(env, *words, check=0):
    done = subprocess.run(
        [sys.executable, "-m", "evalpipe.pipeline", *map(str, words)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == check, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def figures(run: Path) -> dict:
    """What a run's score.json and items.json say of the tasks (not its cost, files or how it was cut); what
    `make report` makes of it (aggregate.md, every benchmark's leaderboard); what the viewer shows of it."""
    score = json.loads((run / "score.json").read_text())
    score["coverage"].pop("shards", None)
    kept = {k: v for k, v in score.items() if k not in ("cost", "selection", "judge_file")}
    outputs = run.parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "evalpipe.stages.report", "--outputs-dir", str(outputs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = collect.read_run("clbench", "m", 1, run, benchmarks.sample_views()["clbench"], collect.Texts(None))
    assert len(seen.samples) == seen.judge_rows == TASKS, seen.problems
    return {
        "score": kept,
        "items": json.loads((run / "items.json").read_text()),
        "report": (outputs / "clbench" / "aggregate.md").read_text(),
        "viewer": {
            "rows": (seen.infer_rows, seen.judge_rows, seen.expected),
            "problems": seen.problems,
            "samples": sorted((s["id"], s["pass"], s["status"], s["preview"]) for s in seen.samples),
        },
    }


@pytest.fixture(scope="module")
def reference(endpoint, tmp_path_factory):
    """An uncut run of the same tasks: its figures."""
    server, slow = endpoint
    folder = tmp_path_factory.mktemp("uncut")
    dataset(folder / "data.jsonl")
    slow.delay = 0.0
    runner(
        base_env(server),
        *("infer", "judge", "score", "RUNS=1", "BENCH=clbench", "MODEL=m"),
        f"DATA={folder / 'data.jsonl'}",
        f"OUTPUTS={folder / 'out'}",
    )
    return figures(folder / "out" / "clbench" / "m" / "run-1")


def asked(server, since: int) -> tuple[Counter, Counter]:
    """The model's and the judge's calls per task since the `since`-th request."""
    model, judge = Counter(), Counter()
    for request in server.chat_requests()[since:]:
        (judge if is_judge(request) else model)[TASK_MARK.findall(request.last_content)[-1]] += 1
    return model, judge


def rows_per_task(run: Path, stem: str) -> tuple[Counter, dict]:
    """Over every part of the run's file: rows per task id, and each context's shard files."""
    rows, files = Counter(), {}
    for part in shards.parts(run / f"{stem}.jsonl"):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            rows[row["idx"]] += 1
            files.setdefault(row["metadata"]["context_id"], set()).add(part.name)
    return rows, files


def check_merged(run: Path, env: dict, reference: dict, server, since: int) -> None:
    """The merged run scores as the uncut one; one row per task; a task asked again only if it was in flight
    when its shard was stopped (at most WORKERS per stage)."""
    runner(env, "score", "RUNS=1", "BENCH=clbench", "MODEL=m", f"OUTPUTS={run.parents[2]}")
    assert figures(run) == reference
    cut = json.loads((run / "score.json").read_text())["coverage"]["shards"]
    assert cut == {"count": SHARDS, "unfinished": [], "without_file": {"infer": [], "judge": []}}
    for stem in ("infer", "judge"):
        rows, files = rows_per_task(run, stem)
        assert rows == Counter({f"task-{i:02d}": 1 for i in range(TASKS)}), stem
        assert all(len(names) == 1 for names in files.values()), files  # a context's tasks in one shard
        assert not (run / f"{stem}.jsonl").exists()
    model, judge = asked(server, since)
    for calls in (model, judge):
        assert set(calls) == {f"task-{i:02d}" for i in range(TASKS)}
        assert sum(calls.values()) - TASKS <= WORKERS, calls


def wait_for_rows(path: Path, process: subprocess.Popen | None = None, timeout: float = 30) -> int:
    """Wait until the file has a complete row (while `process` runs); how many it has then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (count := path.read_bytes().count(b"\n")):
            return count
        if process is not None and process.poll() is not None:
            raise AssertionError(f"exit {process.returncode} before a row in {path}:\n{process.communicate()[0]}")
        time.sleep(0.02)
    raise AssertionError(f"no row in {path} within {timeout} s")


def doc_block(lang: str, marker: str) -> str:
    """The fenced block of docs/scale.md in `lang` that holds `marker`."""
    blocks = re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{len(found)} ```{lang} blocks with {marker!r} in {DOC}"
    return found[0]


@pytest.mark.e2e
def test_indexed_job_command_four_pods_at_once_one_killed_and_run_again(endpoint, reference, tmp_path):
    server, slow = endpoint
    job = yaml.safe_load(doc_block("yaml", "completionMode"))
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["backoffLimitPerIndex"] >= 1
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert int(env["SHARDS"]) == spec["completions"] and env["RESULTS"] == container["volumeMounts"][0]["mountPath"]
    command = container["command"] + container["args"]
    data = re.search(r'DATA="\$RESULTS/([^"]+)"', command[-1])
    assert data, command
    dataset(tmp_path / data.group(1))
    # the volume is tmp_path, the image's /app this repository; four pods, our server, two calls in flight each
    env.update(
        SHARDS=str(SHARDS), RESULTS=str(tmp_path), MODEL="m", WORKERS=str(WORKERS), OPENAI_BASE_URL=server.base_url
    )
    env = {**base_env(server), **env}
    slow.delay, since = DELAY, len(server.chat_requests())
    run = tmp_path / "outputs" / "clbench" / "m" / "run-1"

    def start(k: int) -> subprocess.Popen:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "JOB_COMPLETION_INDEX": str(k)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    pods = [start(k) for k in range(SHARDS)]
    killed = 2
    written = wait_for_rows(run / f"infer.shard-{killed}-of-{SHARDS}.jsonl", pods[killed])
    os.killpg(pods[killed].pid, signal.SIGKILL)  # the pod's processes, as a lost node would
    assert pods[killed].wait(timeout=30) == -signal.SIGKILL
    assert written < TASKS // SHARDS, "the shard finished before it was killed"
    for k, p in enumerate(pods):
        if k != killed:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out

    # the shard is missing: score says which, and exits 3
    runner(env, "score", "RUNS=1", "BENCH=clbench", "MODEL=m", f"OUTPUTS={tmp_path / 'outputs'}", check=3)
    cut = json.loads((run / "score.json").read_text())["coverage"]["shards"]
    assert cut["unfinished"] == [killed] and cut["without_file"]["judge"] == [killed]

    again = start(killed)
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    assert "already done" in out
    check_merged(run, env, reference, server, since)


@pytest.mark.e2e
def test_slurm_array_script_task_cancelled_mid_run_and_requeued(slurm, endpoint, reference, tmp_path):
    server, slow = endpoint
    script = tmp_path / "shards.sbatch"
    script.write_text(doc_block("sh", "#SBATCH"))
    dataset(tmp_path / "data.jsonl")
    outputs, run = tmp_path / "outputs", tmp_path / "outputs" / "clbench" / "m" / "run-1"
    slow.delay, since = DELAY, len(server.chat_requests())
    job = slurm.submit(
        script,
        "--array=0-3",
        "--cpus-per-task=1",
        f"--export=ALL,EVALPIPE={ROOT},OPENAI_BASE_URL={server.base_url},OPENAI_API_KEY={API_KEY}",
        f"--output={tmp_path}/%A_%a.out",
        cwd=tmp_path,
        script_args=(
            *("BENCH=clbench", "MODEL=m", f"WORKERS={WORKERS}"),
            f"DATA={tmp_path / 'data.jsonl'}",
            f"OUTPUTS={outputs}",
        ),
    )
    cancelled = 1
    written = wait_for_rows(run / f"infer.shard-{cancelled}-of-{SHARDS}.jsonl")
    slurm.cancel(job, cancelled)
    tasks = slurm.wait(job, 30, index=cancelled)
    assert tasks[cancelled].state == "CANCELLED"
    assert written < TASKS // SHARDS, "the shard finished before it was cancelled"
    slurm.requeue(job, cancelled)
    tasks = slurm.wait(job, 90)
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("*.out")))
    assert {i: (t.state, t.exit_code) for i, t in tasks.items()} == {i: ("COMPLETED", "0:0") for i in range(4)}, logs
    assert [t.restarts for _, t in sorted(tasks.items())] == [0, 1, 0, 0]
    env = {**base_env(server)}
    check_merged(run, env, reference, server, since)


@pytest.fixture
def stages(endpoint, tmp_path):
    """The stage scripts against the endpoint, answering at once; the dataset; the flags of run 1."""
    server, slow = endpoint
    slow.delay = 0.0
    dataset(tmp_path / "data.jsonl")
    return Stage(base_env(server), tmp_path), tmp_path / "data.jsonl", ("--bench", "clbench", "--model", "m")


@pytest.mark.e2e
def test_resume_across_cuts_and_a_second_count_refused(endpoint, stages, tmp_path):
    """Half the run uncut, the rest as shards: no task asked twice; shards of another count: exit 2."""
    server, _ = endpoint
    stage, data, common = stages
    run = tmp_path / "outputs" / "clbench" / "m" / "run-1"
    since = len(server.chat_requests())
    stage("infer", *common, "--input", data, "--max-samples", TASKS // 2, check=0)
    for k in range(SHARDS):
        done = stage("infer", *common, "--input", data, "--shard", f"{k}/{SHARDS}", check=0)
        assert "already done" in done.stderr
    stage("judge", *common, "--shard", f"0/{SHARDS}", check=0)
    stage("judge", *common, check=0)  # back: the uncut judge does the rest
    model, judge = asked(server, since)
    assert model == judge == Counter({f"task-{i:02d}": 1 for i in range(TASKS)})
    refused = stage("infer", *common, "--input", data, "--shard", "1/8", check=2)
    assert "cut into 4 shards, not 8" in refused.stderr
    (run / "judge.shard-1-of-8.jsonl").write_text("")  # a second count beside the first: readers refuse too
    refused = stage("score", *common, check=2)
    assert "shard files of 4 and of 8 shards" in refused.stderr
    assert API_KEY not in refused.stderr


@pytest.mark.parametrize(
    ("flag", "count", "env", "shard"),
    [
        ("2/8", None, {}, shards.Shard(2, 8)),
        (None, None, {}, None),
        (None, None, {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}, shards.Shard(3, 4)),
        (None, None, {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_MAX": "7"}, (1, 4)),
        (None, 4, {"JOB_COMPLETION_INDEX": "0"}, shards.Shard(0, 4)),
        ("1/4", None, {"JOB_COMPLETION_INDEX": "3"}, shards.Shard(1, 4)),  # the flag wins
        ("all", None, {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}, None),  # an array over models
    ],
)
def test_the_shard_from_flags_or_the_scheduler(flag, count, env, shard):
    found = shards.chosen(flag, count, env)
    assert found == (shards.Shard(*shard) if isinstance(shard, tuple) else shard)


@pytest.mark.parametrize(
    ("flag", "count", "env", "says"),
    [
        ("4/4", None, {}, "0 <= K < N"),
        ("1/4", 8, {}, "disagree"),
        (None, None, {"JOB_COMPLETION_INDEX": "1"}, "--shards N"),
        (None, 4, {"JOB_COMPLETION_INDEX": "4"}, "expected 0 to 3"),
        (None, 4, {}, "needs JOB_COMPLETION_INDEX"),
        (
            None,
            None,
            {
                "SLURM_ARRAY_TASK_ID": "2",
                "SLURM_ARRAY_TASK_MIN": "0",
                "SLURM_ARRAY_TASK_MAX": "6",
                "SLURM_ARRAY_TASK_COUNT": "4",
            },
            "contiguous",
        ),  # fmt: skip
    ],
)
def test_a_shard_that_cannot_be_is_refused(flag, count, env, says):
    with pytest.raises(BadInput, match=re.escape(says)):
        shards.chosen(flag, count, env)


def test_a_task_keeps_its_shard_and_shards_share_the_tasks(tmp_path):
    keys = [f"task-{i}" for i in range(4000)]
    first = [shards.index(key, 8) for key in keys]
    assert first == [shards.index(key, 8) for key in keys]  # stable (no per-process hash seed)
    per_shard = Counter(first)
    assert sorted(per_shard) == list(range(8)) and max(per_shard.values()) < 1.15 * len(keys) / 8
    assert shards.index(7, 3) == shards.index(7, 3) and shards.whole(Path("a/judge-x.shard-0-of-2.jsonl")) == Path(
        "a/judge-x.jsonl"
    )
    (tmp_path / "judge-x.shard-1-of-2.jsonl").write_text("")  # a second opinion, cut: its label, not "x.shard-1-of-2"
    assert paths.labelled_judge_files(tmp_path) == {"x": tmp_path / "judge-x.jsonl"}


@pytest.mark.e2e
def test_a_stand_in_in_a_shard_file_is_redone_by_its_shard_not_by_an_uncut_run(endpoint, stages):
    """The one exception to resume across cuts (docs/scale.md): an uncut judge leaves it and says so (exit 3)."""
    server, slow = endpoint
    stage, data, common = stages
    stage("infer", *common, "--input", data, check=0)
    failing = "task-05"
    k = shards.index("context-01", SHARDS)  # task-05's context

    def judge_fails(request):
        if is_judge(request) and f"[{failing}]" in request.last_content:
            return replace(scripted(request), status=500, body=b'{"error": {"message": "judge down"}}')
        return scripted(request)

    server.handler = judge_fails
    try:
        stage("judge", *common, "--shard", f"{k}/{SHARDS}", "--max-retries", "0", check=3)
    finally:
        server.handler = slow
    since = len(server.chat_requests())
    uncut = stage("judge", *common, check=3)
    assert "1 rows to do again are in shard files" in uncut.stderr
    assert failing not in asked(server, since)[1]
    stage("judge", *common, "--shard", f"{k}/{SHARDS}", check=0)
    assert asked(server, since)[1][failing] == 1
    scored = stage("score", *common, check=0)
    assert "wrote" in scored.stderr


def test_judge_gives_only_the_rows_it_counted(tmp_path):
    """Another shard's answers written after judge counted its rows are not judged by this shard."""
    from evalpipe.benchmarks import get
    from evalpipe.stages.graded import InputRows, shard_filter

    bench, shard = get("clbench"), shards.Shard(0, 2)
    rows = [{"idx": f"t{i}", "metadata": {"context_id": f"c{i}"}} for i in range(40)]
    mine = [row for row in rows if shard.takes(f"{row['metadata']['context_id']}")]
    infer = tmp_path / "infer.jsonl"
    infer.write_text("".join(json.dumps(row) + "\n" for row in rows[:20]))
    counted = InputRows(infer, keep=shard_filter(bench, shard))
    later = [json.dumps(row) + "\n" for row in rows[20:] if row not in mine]
    other = tmp_path / "infer.shard-1-of-2.jsonl"  # the other shard writes meanwhile: before the pending count
    other.write_text("".join(later[:5]))
    pending = counted.pending(set())
    other.write_text("".join(later))  # and after it
    given = [task.id for task in pending]
    assert given == [row["idx"] for row in mine if row in rows[:20]] and len(given) == len(pending)


def test_shards_write_side_by_side_but_never_beside_an_uncut_run(tmp_path):
    from evalpipe.errors import Locked
    from evalpipe.store import lock

    whole = tmp_path / "infer.jsonl"
    first, second = shards.Shard(0, 2).path(whole), shards.Shard(1, 2).path(whole)
    with lock.exclusive(first):
        with lock.exclusive(second):
            pass
        with pytest.raises(Locked, match="being written by another run"), lock.exclusive(whole):
            pass
        with pytest.raises(Locked, match="being written by another run"), lock.exclusive(first):
            pass
    with lock.exclusive(whole):
        with pytest.raises(Locked, match="being written by an uncut run on infer.jsonl"), lock.exclusive(second):
            pass
