"""Shared-prefix scheduling (evalpipe.client.scheduler): each group's first task alone, its siblings once
it is answered.

The scheduler through runner.run with real asyncio tasks, then infer.py over loopback HTTP against the
test server's PrefixCache: siblings hit the cache, cached tokens land in the rows and the summary, and
a leader the server always rejects does not hold its siblings back.
"""

import asyncio
import itertools
from dataclasses import dataclass

import pytest

from evalpipe.client import runner
from evalpipe.client.scheduler import PrefixSchedule
from evalpipe.devtools.testserver import PrefixCache, Reply
from evalpipe.errors import EXIT_INCOMPLETE, EXIT_OK, CallFailed, EndpointRefused
from evalpipe.store import manifest

from .conftest import read_jsonl, write_jsonl


@dataclass(eq=False)
class Task:
    id: str
    group: str | None


def grouped(groups: int, size: int) -> list[Task]:
    """`groups` groups of `size` tasks, each group's tasks next to each other (as CL-bench's contexts)."""
    return [Task(f"g{g}-{i}", f"g{g}") for g in range(groups) for i in range(size)]


def group_of(task: Task) -> str | None:
    return task.group


class Recorder:
    """A work function that logs when each task starts and ends, and how many are in flight."""

    def __init__(self, fail=lambda task: None, seconds: float = 0.005):
        self.events: list[tuple[str, str]] = []
        self.in_flight = self.peak = 0
        self.fail, self.seconds = fail, seconds

    async def __call__(self, task: Task) -> dict:
        self.events.append(("start", task.id))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.seconds)
            error = self.fail(task)
            if error is not None:
                raise error
            return {"idx": task.id}
        finally:
            self.in_flight -= 1
            self.events.append(("end", task.id))

    def starts(self) -> list[str]:
        return [tid for kind, tid in self.events if kind == "start"]

    def at(self, kind: str, tid: str) -> int:
        return self.events.index((kind, tid))


def run(tasks, work, output, **kw):
    settings = runner.Settings(**{"workers": 4, "progress": "log", **kw})
    return asyncio.run(
        asyncio.wait_for(
            runner.run(tasks, lambda task, _: work(task), output, settings, label="unit", group_of=group_of), 30
        )
    )


# ---------------------------------------------------------------- the scheduler in runner.run


def test_a_leader_goes_alone_and_its_siblings_once_it_is_answered(tmp_path):
    tasks, work = grouped(6, 4), Recorder()
    summary = run(tasks, work, tmp_path / "out.jsonl")
    assert summary.written == 24 and sorted(r["idx"] for r in read_jsonl(tmp_path / "out.jsonl")) == sorted(
        t.id for t in tasks
    )
    for g in range(6):
        for i in range(1, 4):
            assert work.at("start", f"g{g}-{i}") > work.at("end", f"g{g}-0")
    # the four workers start on four leaders at once: other groups fill the slots a sibling may not take
    assert work.starts()[:4] == ["g0-0", "g1-0", "g2-0", "g3-0"]
    assert work.peak == 4


def test_with_one_worker_or_without_groups_the_tasks_go_in_dataset_order(tmp_path):
    tasks = grouped(3, 3)
    work = Recorder()
    run(tasks, work, tmp_path / "one.jsonl", workers=1)
    assert work.starts() == [t.id for t in tasks]
    ungrouped = [Task(f"t{i}", None) for i in range(9)]
    work = Recorder()
    run(ungrouped, work, tmp_path / "none.jsonl", workers=1)
    assert work.starts() == [t.id for t in ungrouped]


def test_when_only_siblings_remain_the_workers_wait_for_the_leader_then_fill_up(tmp_path):
    work = Recorder()
    run(grouped(1, 5), work, tmp_path / "out.jsonl")
    assert work.events[:2] == [("start", "g0-0"), ("end", "g0-0")]
    assert work.peak == 4  # the four siblings went together once the leader was answered


def test_a_leader_that_keeps_failing_does_not_hold_its_siblings(tmp_path):
    def fail(task: Task):
        return CallFailed("HTTP 400: rejected") if task.id in ("g0-0", "g0-1") else None

    work = Recorder(fail)
    out = tmp_path / "out.jsonl"
    summary = run(grouped(2, 4), work, out)
    assert (summary.written, summary.failed) == (6, 2)
    assert {r["idx"] for r in read_jsonl(out)} == {"g0-2", "g0-3", "g1-0", "g1-1", "g1-2", "g1-3"}
    assert [r["idx"] for r in read_jsonl(runner.failures_path(out))] == ["g0-0", "g0-1"]
    # the failed leader's next sibling led in its place; the rest waited for it
    assert work.at("start", "g0-1") > work.at("end", "g0-0")
    assert work.at("start", "g0-2") > work.at("end", "g0-1") and work.at("start", "g0-3") > work.at("end", "g0-1")


def test_no_task_goes_after_the_endpoint_refuses_us(tmp_path):
    def refuse(task: Task):
        return EndpointRefused("401") if task.id == "g0-0" else None

    work = Recorder(refuse)
    summary = run(grouped(1, 4), work, tmp_path / "out.jsonl")
    assert summary.refused is not None
    assert work.starts() == ["g0-0"]  # its siblings were waiting for it: none was sent after the stop


def test_reading_ahead_is_bounded_and_a_waiting_worker_stops_with_the_run():
    pulled = itertools.count()

    def endless():
        for i in pulled:
            yield Task(f"t{i}", "one group")

    async def scenario() -> None:
        stop = asyncio.Event()
        schedule = PrefixSchedule(endless(), group_of, stop, lookahead=3)
        leader = await schedule.next()
        assert leader is not None and leader.id == "t0"
        waiting = asyncio.ensure_future(schedule.next())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # its siblings wait for the leader...
        assert next(pulled) == 4  # ...and no more than `lookahead` of them were read: t1..t3
        stop.set()
        assert await asyncio.wait_for(waiting, 5) is None

    asyncio.run(scenario())


def test_a_leader_that_never_returns_releases_its_siblings_after_the_patience():
    async def scenario() -> None:
        schedule = PrefixSchedule(grouped(1, 3), group_of, asyncio.Event(), patience_s=0.05)
        leader = await schedule.next()
        siblings = [await asyncio.wait_for(schedule.next(), 5) for _ in range(2)]
        assert [t.id for t in siblings] == ["g0-1", "g0-2"]
        schedule.ended(leader, answered=True)  # late: nothing is left to release
        assert await asyncio.wait_for(schedule.next(), 5) is None

    asyncio.run(scenario())


# ---------------------------------------------------------------- infer.py over HTTP, against a prefix cache


def clbench_rows(contexts: int, per_context: int) -> list[dict]:
    """CL-bench rows: per context a long system message shared by its tasks, the tasks next to each other."""
    rows = []
    for c in range(contexts):
        system = f"Context {c}: " + "the rules of this system say many things. " * 200
        for t in range(per_context):
            rows.append(
                {
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"Question {c}.{t}: what do the rules say?"},
                    ],
                    "rubrics": ["states the rule"],
                    "metadata": {"task_id": f"task-{c}-{t}", "context_id": f"ctx-{c}"},
                }
            )
    return rows


def answer_after(seconds: float):
    def handler(request) -> Reply:
        return Reply(content="the rules say so", delay=seconds)

    return handler


def test_siblings_hit_the_prefix_cache_and_the_cached_tokens_are_recorded(server, stage, tmp_path):
    data = tmp_path / "cl.jsonl"
    write_jsonl(data, clbench_rows(6, 4))
    server.handler = PrefixCache(answer_after(0.1))
    common = ("--bench", "clbench", "--model", "m", "--input", data, "--workers", 8)

    done = stage("infer", *common, "--output", tmp_path / "sched.jsonl", "--prompt-cache-key", "on", check=EXIT_OK)
    rows = read_jsonl(tmp_path / "sched.jsonl")
    cached = [r for r in rows if r["usage"].get("cached_tokens")]
    assert len(cached) == 18  # all but the first task of each context
    assert {r["idx"] for r in rows if r not in cached} == {f"task-{c}-0" for c in range(6)}
    total = sum(r["usage"]["prompt_tokens"] for r in rows)
    hits = sum(r["usage"]["cached_tokens"] for r in cached)
    assert f"infer: {hits:,} of {total:,} prompt tokens cached" in done.stderr
    counts = manifest.read(tmp_path / "sched.jsonl")["counts"]
    assert (counts["prompt_tokens"], counts["cached_prompt_tokens"]) == (total, hits)
    keys = {r.body["messages"][1]["content"].split(":")[0]: r.body.get("prompt_cache_key") for r in server.requests}
    assert keys["Question 3.2"] == "ctx-3"  # --prompt-cache-key on: the context id, nothing else

    server.requests.clear()
    server.handler = PrefixCache(answer_after(0.3))  # a cold cache; the first 8 requests go out before any answer
    stage("infer", *common, "--output", tmp_path / "naive.jsonl", "--prefix-schedule", "off", check=EXIT_OK)
    naive = [r for r in read_jsonl(tmp_path / "naive.jsonl") if r["usage"].get("cached_tokens")]
    assert len(naive) < 18  # dataset order: the siblings of the first contexts went out together and missed
    # --prompt-cache-key auto against another endpoint than OpenAI's: the request as upstream sends it
    assert all(sorted(r.body) == ["messages", "model"] for r in server.chat_requests())


@pytest.mark.parametrize("status", [400, 500])
def test_siblings_are_answered_when_the_server_always_fails_their_leader(server, stage, tmp_path, status):
    data = tmp_path / "cl.jsonl"
    write_jsonl(data, clbench_rows(2, 3))

    def handler(request) -> Reply:
        if request.last_content.startswith("Question 0.0:"):
            return Reply.error(status, "no answer for this one")
        return Reply(content="the rules say so", delay=0.05)

    server.handler = PrefixCache(handler)
    out = tmp_path / "infer.jsonl"
    args = ("--bench", "clbench", "--model", "m", "--input", data, "--output", out, "--workers", 4)
    stage("infer", *args, "--max-retries", 1, "--backoff", 0.01, check=EXIT_INCOMPLETE)
    assert {r["idx"] for r in read_jsonl(out)} == {"task-0-1", "task-0-2", "task-1-0", "task-1-1", "task-1-2"}
    assert [r["idx"] for r in read_jsonl(runner.failures_path(out))] == ["task-0-0"]
    # the failed leader's next sibling led, the last one read its prefix from the cache
    usage = {r["idx"]: r["usage"] for r in read_jsonl(out)}
    assert "cached_tokens" not in usage["task-0-1"] and usage["task-0-2"]["cached_tokens"] > 0
