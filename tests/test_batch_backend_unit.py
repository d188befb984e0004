"""evalpipe.client.batch_backend in process: the state file, the open-batch guard, and `advance` driving
FakeOpenAI's Files and Batches endpoints with the real openai client (no subprocesses)."""

import argparse
import dataclasses
import json
import signal
import socket
from dataclasses import dataclass

import openai
import pytest

from evalpipe.client import batch, batch_backend, runner
from evalpipe.client.batch_backend import (
    MAX_SUBMISSIONS,
    State,
    advance,
    refuse_other_engines,
    state_path,
)
from evalpipe.client.llm import Endpoint
from evalpipe.devtools.testserver import Reply
from evalpipe.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_WAITING, BadInput, EndpointRefused, EndpointUnreachable
from evalpipe.stages import engine
from evalpipe.store import jsonl

from .conftest import API_KEY, read_jsonl


@dataclass
class Task:
    id: str
    prompt: str


TASKS = [Task(f"t{i}", f"question number {i}") for i in range(5)]


def answer(request) -> Reply:
    return Reply(content="A:" + request.last_content)


async def work(task, client):
    done = await client.complete([{"role": "user", "content": task.prompt}])
    return {"idx": task.id, "model_output": done.text, "finish_reason": done.finish_reason}


def pending_for(out, tasks=TASKS):
    return lambda: [t for t in tasks if t.id not in jsonl.ids_in(out, lambda r: r["idx"])]


def settings(**kw) -> runner.Settings:
    return runner.Settings(**{"batch_poll": 0.01, "grace": 5.0, "progress": "log", **kw})


def endpoint_for(server) -> Endpoint:
    return Endpoint("m", base_url=server.base_url, api_key=API_KEY)


@pytest.fixture(autouse=True)
def keep_sigterm():
    """advance() makes SIGTERM raise KeyboardInterrupt (a clean stop between steps): not in pytest after the test."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def job_for(endpoint, out, **kw) -> batch.Job:
    return batch.Job("infer", work, endpoint, out, settings(**kw))


def go(server, out, tasks=TASKS, **kw):
    return advance(job_for(endpoint_for(server), out, **kw), pending_for(out, tasks))


# ---------------------------------------------------------------- the state file


def test_a_new_state_is_empty_and_saving_writes_it_beside_the_output(tmp_path):
    out = tmp_path / "infer.jsonl"
    state = State(out)
    assert (state.batches, state.submissions, state.open_batches()) == ([], {}, [])
    assert not state_path(out).exists()
    state.batches = [{"id": "batch_1", "requests": 3}, {"id": "batch_2", "requests": 1, "imported": True}]
    state.submissions = {"t0~abc": 1}
    state.save()
    assert state_path(out) == tmp_path / "infer.jsonl.batch.json"
    assert json.loads(state_path(out).read_text()) == {"batches": state.batches, "submissions": {"t0~abc": 1}}
    again = State(out)
    assert again.batches == state.batches and again.submissions == {"t0~abc": 1}
    assert [b["id"] for b in again.open_batches()] == ["batch_1"]
    assert [b["id"] for b in State(out).open_batches()] == ["batch_1"]


def test_open_batches_without_a_state_file_is_none(tmp_path):
    assert State(tmp_path / "infer.jsonl").open_batches() == []
    assert not state_path(tmp_path / "infer.jsonl").exists()


def test_a_state_without_submissions_still_loads(tmp_path):
    out = tmp_path / "infer.jsonl"
    state_path(out).write_text(json.dumps({"batches": [{"input_file_id": "file-1"}]}))
    state = State(out)
    assert state.submissions == {} and state.open_batches() == [{"input_file_id": "file-1"}]


@pytest.mark.parametrize("content", [b"{not json", b'{"submissions": {}}', b"[1, 2]", b""])
def test_an_unreadable_state_is_bad_input_and_left_alone(tmp_path, content):
    out = tmp_path / "infer.jsonl"
    state_path(out).write_bytes(content)
    with pytest.raises(BadInput, match="unreadable batch state .*repair it rather than deleting it") as bad:
        State(out)
    assert str(state_path(out)) in str(bad.value)
    assert state_path(out).read_bytes() == content


def test_other_engines_are_refused_while_batches_are_open(tmp_path):
    out = tmp_path / "infer.jsonl"
    open_ = [{"id": "batch_a"}, {"input_file_id": "file-x"}]
    with pytest.raises(BadInput) as refused:
        refuse_other_engines(out, open_)
    message = str(refused.value)
    assert "2 Batch API batches" in message and "batch_a, (being created)" in message
    assert str(state_path(out)) in message and "--backend batch" in message
    refuse_other_engines(out, [])  # nothing open (the Batch API's engine and --dry-run: test_batch.py)


# ---------------------------------------------------------------- advance against FakeOpenAI


def test_cron_steps_exit_75_until_the_batch_is_imported(server, tmp_path):
    server.handler, server.batch_polls_to_finish = answer, 2
    out = tmp_path / "infer.jsonl"
    assert go(server, out) == EXIT_WAITING  # uploaded and created
    state = State(out)
    [entry] = state.batches
    assert entry["id"].startswith("batch_") and entry["requests"] == 5 and not entry.get("imported")
    assert sorted(state.submissions.values()) == [1] * 5
    assert [line["custom_id"].split("~")[0] for line in read_jsonl(entry["input"])] == [t.id for t in TASKS]
    assert read_jsonl(out) == []

    assert go(server, out) == EXIT_WAITING  # in progress
    assert State(out).batches[0]["status"] == "in_progress" and read_jsonl(out) == []

    assert go(server, out) == EXIT_OK  # completed: downloaded and imported
    rows = {r["idx"]: r for r in read_jsonl(out)}
    assert len(read_jsonl(out)) == 5 and rows["t3"]["model_output"] == "A:question number 3"
    assert all(r["batch"] is True for r in rows.values())  # marked as served by a batch
    [entry] = State(out).batches
    assert entry["imported"] and entry["status"] == "completed"
    assert all(json.loads(line) for path in entry["files"] for line in open(path))
    assert server.chat_requests() == [] and len(server.batches()) == 1

    assert go(server, out) == EXIT_OK  # nothing left: nothing submitted, nothing written twice
    assert len(server.batches()) == 1 and len(read_jsonl(out)) == 5
    assert all(API_KEY not in p.read_text() for p in tmp_path.rglob("*") if p.is_file())


def test_batch_wait_keeps_polling_in_one_call(server, tmp_path):
    server.handler, server.batch_polls_to_finish = answer, 3
    out = tmp_path / "infer.jsonl"
    assert go(server, out, batch_wait=20, batch_poll=0.01) == EXIT_OK
    assert len(read_jsonl(out)) == 5 and len(server.batches()) == 1


def test_expired_batches_keep_their_answers_and_the_rest_is_sent_again(server, tmp_path):
    server.handler, server.batch_polls_to_finish, server.batch_expire_after = answer, 1, 2
    out = tmp_path / "infer.jsonl"
    assert go(server, out, batch_wait=20) == EXIT_OK
    assert [(b["status"], b["request_counts"]["total"]) for b in server.batches()] == [
        ("expired", 5),
        ("expired", 3),
        ("completed", 1),
    ]
    assert sorted(r["idx"] for r in read_jsonl(out)) == [t.id for t in TASKS]


def test_a_request_that_keeps_failing_is_given_up_after_max_submissions(server, tmp_path, capsys):
    server.handler = lambda r: Reply.error(400, "unsupported content") if r.last_content.endswith(" 1") else answer(r)
    server.batch_polls_to_finish = 1
    out = tmp_path / "infer.jsonl"
    assert go(server, out, batch_wait=20) == EXIT_INCOMPLETE
    assert [b["request_counts"]["total"] for b in server.batches()] == [5] + [1] * (MAX_SUBMISSIONS - 1)
    assert sorted(r["idx"] for r in read_jsonl(out)) == ["t0", "t2", "t3", "t4"]
    [failed] = [cid for cid, n in State(out).submissions.items() if cid.startswith("t1~")]
    assert State(out).submissions[failed] == MAX_SUBMISSIONS
    side = read_jsonl(runner.failures_path(out))
    assert [r["idx"] for r in side] == ["t1"]  # the same failure, imported three times, recorded once
    assert "HTTP 400" in side[0]["error"] and "unsupported content" in side[0]["error"]
    assert f"failed in {MAX_SUBMISSIONS} batches" in capsys.readouterr().err

    assert go(server, out) == EXIT_INCOMPLETE  # not submitted a fourth time
    assert len(server.batches()) == MAX_SUBMISSIONS


def test_a_batch_that_fails_validation_is_bad_input_with_its_reasons(server, tmp_path):
    server.batch_fail_validation, server.batch_polls_to_finish = True, 1
    out = tmp_path / "infer.jsonl"
    with pytest.raises(BadInput, match="failed validation .*batch_fail_validation"):
        go(server, out, batch_wait=20)
    [entry] = State(out).batches
    assert entry["imported"] and entry["status"] == "failed" and entry["errors"]["data"]
    assert len(server.batches()) == 1 and read_jsonl(out) == []


def upload_requests(server, tmp_path, out):
    lines = batch.request_lines(job_for(endpoint_for(server), out), TASKS)
    [path] = batch.write_request_files(lines, batch_backend.files_dir(out) / "input-crash.jsonl", settings())
    client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    uploaded = client.files.create(file=(path.name, path.read_bytes()), purpose="batch")
    entry = {"input": str(path), "input_file_id": uploaded.id, "requests": len(lines)}
    state_path(out).write_text(
        json.dumps({"batches": [entry], "submissions": {line["custom_id"]: 1 for line in lines}})
    )
    return client, uploaded


def test_a_batch_created_before_a_crash_saved_its_id_is_adopted(server, tmp_path):
    server.handler, server.batch_polls_to_finish = answer, 1
    out = tmp_path / "infer.jsonl"
    client, uploaded = upload_requests(server, tmp_path, out)
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert go(server, out, batch_wait=20) == EXIT_OK
    assert [b["id"] for b in server.batches()] == [created.id]  # nothing submitted twice
    assert State(out).batches[0]["id"] == created.id
    assert len(read_jsonl(out)) == 5


def test_an_upload_that_never_became_a_batch_is_dropped_and_sent_again(server, tmp_path):
    server.handler, server.batch_polls_to_finish = answer, 1
    out = tmp_path / "infer.jsonl"
    upload_requests(server, tmp_path, out)
    assert go(server, out, batch_wait=20) == EXIT_OK
    assert len(server.batches()) == 1 and len(read_jsonl(out)) == 5
    assert [b.get("input") for b in State(out).batches if "crash" in b.get("input", "")] == []


@pytest.mark.parametrize(
    "flags, named",
    [
        ({"backend": "batch"}, "--backend batch"),
        ({"export_batch": "x.jsonl"}, "--export-batch"),
        ({"import_batch": ["x.jsonl"], "max_cost": 1.0}, "--import-batch"),
    ],
)
def test_without_an_endpoint_there_is_nothing_to_batch(tmp_path, flags, named):
    """engine.run refuses every batch engine to a stage that makes no API calls (a rule judge), before its lock."""
    out = tmp_path / "judge.jsonl"
    args = {"dry_run": False, "backend": "online", "export_batch": None, "import_batch": None, "max_cost": None}
    job = engine.Job("judge", out, None, None, {}, ("selected", 0), set, None, None, None)
    with pytest.raises(BadInput, match=f"judge makes no API calls for this benchmark: run it without {named}"):
        engine.run(job, argparse.Namespace(**{**dataclasses.asdict(runner.Settings()), **args, **flags}))
    assert not state_path(out).exists() and not out.exists()


def test_a_server_without_a_batch_api_is_a_refusal(server, tmp_path):
    out = tmp_path / "infer.jsonl"
    endpoint = Endpoint("m", base_url=server.base_url.replace("/v1", "/no-batches-here"), api_key=API_KEY)
    with pytest.raises(EndpointRefused, match="the Batch API refused us") as refused:
        advance(job_for(endpoint, out), pending_for(out))
    assert API_KEY not in str(refused.value)
    assert not state_path(out).exists()


def test_nothing_listening_is_unreachable_and_says_where(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    out = tmp_path / "infer.jsonl"
    # max_retries 0: the batch client still retries twice (its floor), not the default six times with backoff
    endpoint = Endpoint("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(EndpointUnreachable, match=f"cannot reach the Batch API at http://127.0.0.1:{port}/v1"):
        advance(job_for(endpoint, out), pending_for(out))
