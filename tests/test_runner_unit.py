"""evalpipe.client.runner in process: the bounded-concurrency loop, its side file, summary and exit codes.

Real files in tmp_path, real asyncio tasks, and FakeOpenAI over loopback HTTP where a client is needed.
"""

import asyncio
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from evalpipe.client import runner
from evalpipe.client.llm import Endpoint
from evalpipe.devtools.testserver import Reply
from evalpipe.errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, CallFailed, EndpointRefused, OutputUnwritable

from .conftest import API_KEY, read_jsonl


@dataclass
class Task:
    id: str
    prompt: str = ""


def tasks(n: int) -> list[Task]:
    return [Task(f"t{i}", f"question {i}") for i in range(n)]


def run(pending, work, output: Path, label="unit", **kw):
    settings = runner.Settings(**{"workers": 4, "progress": "log", **kw})
    return asyncio.run(runner.run(pending, lambda task, client: work(task), output, settings, label=label))


async def echo(task):
    await asyncio.sleep(0)
    return {"idx": task.id, "answer": task.prompt.upper()}


# ---------------------------------------------------------------- rows and side file


def test_every_task_is_appended_once(tmp_path):
    out = tmp_path / "out.jsonl"
    summary = run(tasks(7), echo, out)
    rows = read_jsonl(out)
    assert sorted(r["idx"] for r in rows) == [f"t{i}" for i in range(7)]
    assert {r["idx"]: r["answer"] for r in rows}["t3"] == "QUESTION 3"
    assert (summary.pending, summary.written, summary.failed, summary.skipped) == (7, 7, 0, 0)
    assert not summary.interrupted and summary.refused is None
    assert not runner.failures_path(out).exists()  # nothing failed: no side file
    assert runner.finish("unit", summary, out) == EXIT_OK


def test_a_second_run_appends_and_keeps_the_rows_already_there(tmp_path):
    out = tmp_path / "out.jsonl"
    run(tasks(3), echo, out)
    summary = run([Task("t9", "late")], echo, out)
    ids = [r["idx"] for r in read_jsonl(out)]
    assert sorted(ids[:3]) == ["t0", "t1", "t2"] and ids[3:] == ["t9"]  # appended after the first run's rows
    assert summary.written == 1


def test_failed_calls_stay_pending_and_are_listed_in_the_side_file(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    failing = {"t1", "t4", "t5", "t6"}

    async def work(task):
        if task.id in failing:
            raise CallFailed(f"HTTP 500: boom for {task.id}")
        return await echo(task)

    summary = run(tasks(8), work, out, label="infer")
    assert sorted(r["idx"] for r in read_jsonl(out)) == sorted({f"t{i}" for i in range(8)} - failing)
    side = read_jsonl(runner.failures_path(out))
    assert runner.failures_path(out) == tmp_path / "out.jsonl.failed.jsonl"
    assert sorted(r["idx"] for r in side) == sorted(failing)
    assert all(r["stage"] == "infer" and r["error"] == f"HTTP 500: boom for {r['idx']}" and r["at"] for r in side)
    assert (summary.written, summary.failed) == (4, 4)
    assert len(summary.first_errors) == 3 and all(e.split(":")[0] in failing for e in summary.first_errors)

    capsys.readouterr()
    assert runner.finish("infer", summary, out) == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert "wrote 4 rows, 4 failed, 0 not attempted" in err
    assert f"failures are listed in {runner.failures_path(out)}; rerun to retry them" in err

    # the next run gets only the pending tasks (the stage computes selected − done) and finishes them
    done = {r["idx"] for r in read_jsonl(out)}
    again = run([t for t in tasks(8) if t.id not in done], echo, out, label="infer")
    assert (again.written, again.failed) == (4, 0)
    assert sorted(r["idx"] for r in read_jsonl(out)) == [f"t{i}" for i in range(8)]
    assert len(read_jsonl(runner.failures_path(out))) == 4  # history is kept, not rewritten
    assert runner.finish("infer", again, out) == EXIT_OK


def test_a_torn_side_file_is_repaired_even_when_nothing_fails(tmp_path):
    out = tmp_path / "out.jsonl"
    side = runner.failures_path(out)
    side.write_bytes(b'{"idx": "t0", "stage": "unit", "error": "x"}\n{"idx": "t1", "sta')
    summary = run([], echo, out)
    assert summary.pending == 0 and summary.written == 0
    assert side.read_bytes() == b'{"idx": "t0", "stage": "unit", "error": "x"}\n'
    assert not out.exists()  # nothing to do: the output is not even created


def test_a_row_of_none_is_skipped_not_written(tmp_path):
    out = tmp_path / "out.jsonl"

    async def work(task):
        return None if task.id in ("t0", "t2") else await echo(task)

    summary = run(tasks(4), work, out)
    assert sorted(r["idx"] for r in read_jsonl(out)) == ["t1", "t3"]
    assert (summary.written, summary.skipped, summary.failed) == (2, 2, 0)
    assert runner.finish("unit", summary, out) == EXIT_INCOMPLETE  # written < pending


@pytest.mark.parametrize("workers, n", [(3, 12), (1, 5), (8, 2)])
def test_never_more_than_workers_calls_in_flight(tmp_path, workers, n):
    state = {"now": 0, "max": 0, "started": 0}

    async def work(task):
        state["now"] += 1
        state["started"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return {"idx": task.id}

    summary = run(tasks(n), work, tmp_path / "out.jsonl", workers=workers)
    assert summary.written == n and state["started"] == n
    assert state["max"] == min(workers, n)


# ---------------------------------------------------------------- stopping


def test_a_refusal_stops_new_calls_and_finish_raises_it(tmp_path):
    out = tmp_path / "out.jsonl"
    started = []

    async def work(task):
        started.append(task.id)
        if task.id == "t2":
            raise EndpointRefused("401: no such key")
        await asyncio.sleep(0.01)
        return {"idx": task.id}

    summary = run(tasks(20), work, out, workers=2)
    assert isinstance(summary.refused, EndpointRefused) and "no such key" in str(summary.refused)
    assert len(started) < 20  # the queue was not drained after the refusal
    assert summary.written == len(read_jsonl(out)) < 20
    assert "t2" not in {r["idx"] for r in read_jsonl(out)}
    with pytest.raises(EndpointRefused, match="no such key"):
        runner.finish("unit", summary, out)


def test_sigint_stops_new_calls_waits_for_calls_in_flight_and_exits_130(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    started = []

    async def work(task):
        started.append(task.id)
        if task.id == "t1":
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the runner's handler takes it, not pytest
        await asyncio.sleep(0.05)
        return {"idx": task.id}

    summary = run(tasks(30), work, out, workers=2, grace=5)
    assert summary.interrupted
    assert "SIGINT received: no new calls" in capsys.readouterr().err
    assert set(started) <= {"t0", "t1", "t2", "t3"}  # at most the next call per worker was already under way
    assert sorted(r["idx"] for r in read_jsonl(out)) == sorted(started)  # calls in flight finished and were kept
    assert summary.written == len(started)
    assert runner.finish("unit", summary, out) == EXIT_INTERRUPTED
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is handed back


def test_calls_still_running_after_the_grace_period_are_abandoned(tmp_path):
    out = tmp_path / "out.jsonl"

    async def work(task):
        if task.id == "t0":
            os.kill(os.getpid(), signal.SIGTERM)
            return {"idx": task.id}
        await asyncio.sleep(30)  # a hung call
        return {"idx": task.id}

    began = time.monotonic()
    summary = run(tasks(3), work, out, workers=3, grace=0.3)
    assert time.monotonic() - began < 5
    assert summary.interrupted and summary.written == 1
    assert [r["idx"] for r in read_jsonl(out)] == ["t0"]


def test_a_side_file_of_the_work_that_cannot_be_written_ends_the_run_with_output_unwritable(tmp_path, capsys):
    out = tmp_path / "out.jsonl"

    async def work(task):
        if task.id == "t3":
            raise OutputUnwritable(tmp_path / "out.jsonl.steps.jsonl", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        await asyncio.sleep(0.01)
        return {"idx": task.id}

    with pytest.raises(OutputUnwritable) as stopped:
        run(tasks(40), work, out, workers=1)
    assert stopped.value.error.errno == errno.ENOSPC and "steps.jsonl" in str(stopped.value.path)
    assert sorted(r["idx"] for r in read_jsonl(out)) == ["t0", "t1", "t2"]  # what finished before is kept
    err = capsys.readouterr().err
    assert "no new calls" in err and "wrote 3 rows" in err


def test_progress_lines_when_not_on_a_terminal(tmp_path, capsys):
    async def work(task):
        if task.id == "t1":
            raise CallFailed("nope")
        return {"idx": task.id}

    run(tasks(3), work, tmp_path / "out.jsonl", workers=1, log_every=0, label="judge")
    lines = [said for said in capsys.readouterr().err.splitlines() if said.startswith("judge: ")]
    assert lines[-1].startswith("judge: 3/3 finished, 1 failed, ")


# ---------------------------------------------------------------- runner.run with a client against the loopback server


def settings(**kw) -> runner.Settings:
    return runner.Settings(**{"workers": 3, "grace": 5.0, "progress": "log", **kw})


def endpoint_for(server, **kw) -> Endpoint:
    kw.setdefault("max_retries", 1)
    return Endpoint("m", base_url=server.base_url, api_key=API_KEY, backoff_initial=0.01, backoff_max=0.02, **kw)


async def ask(task, client):
    done = await client.complete([{"role": "user", "content": task.prompt}])
    return {"idx": task.id, "model_output": done.text, "usage": done.usage}


def test_run_with_a_client_sends_one_call_per_task_and_writes_its_answer(server, tmp_path):
    server.handler = lambda r: Reply(content="A:" + r.last_content, delay=0.02)
    out = tmp_path / "out.jsonl"
    summary = asyncio.run(runner.run(tasks(6), ask, out, settings(), label="infer", endpoint=endpoint_for(server)))
    rows = {r["idx"]: r for r in read_jsonl(out)}
    assert len(read_jsonl(out)) == 6 and rows["t4"]["model_output"] == "A:question 4"
    assert rows["t4"]["usage"]["completion_tokens"] >= 1
    assert sorted(r.last_content for r in server.chat_requests()) == sorted(t.prompt for t in tasks(6))
    assert {r.headers["authorization"] for r in server.chat_requests()} == {f"Bearer {API_KEY}"}
    assert runner.finish("infer", summary, out) == EXIT_OK


def test_run_with_a_client_http_failures_become_side_file_rows(server, tmp_path):
    server.handler = lambda r: (
        Reply.error(400, "unsupported content") if r.last_content == "question 2" else Reply("ok")
    )
    out = tmp_path / "out.jsonl"
    summary = asyncio.run(runner.run(tasks(4), ask, out, settings(), label="infer", endpoint=endpoint_for(server)))
    assert sorted(r["idx"] for r in read_jsonl(out)) == ["t0", "t1", "t3"]
    [failure] = read_jsonl(runner.failures_path(out))
    assert failure["idx"] == "t2" and "HTTP 400" in failure["error"] and "unsupported content" in failure["error"]
    assert API_KEY not in runner.failures_path(out).read_text()
    assert runner.finish("infer", summary, out) == EXIT_INCOMPLETE


def test_run_with_a_client_stops_when_the_endpoint_refuses(server, tmp_path):
    server.handler = lambda r: Reply.error(401, "invalid api key", code="invalid_api_key")
    out = tmp_path / "out.jsonl"
    summary = asyncio.run(
        runner.run(tasks(30), ask, out, settings(workers=2), label="infer", endpoint=endpoint_for(server))
    )
    assert summary.refused is not None and summary.written == 0
    assert len(server.chat_requests()) < 30
    with pytest.raises(EndpointRefused, match="refused model 'm'"):
        runner.finish("infer", summary, out)


def test_run_with_a_client_without_an_endpoint_hands_work_no_client(tmp_path):
    seen = []

    async def work(task, client):
        seen.append(client)
        return {"idx": task.id}

    out = tmp_path / "out.jsonl"
    summary = asyncio.run(runner.run(tasks(3), work, out, settings(), label="score"))
    assert seen == [None, None, None] and summary.written == 3
