"""FakeOpenAI's Files and Batches endpoints, driven by the real openai SDK (sync and async)."""

import asyncio
import io
import json

import openai
import pytest

from evalpipe.devtools.testserver import FakeOpenAI, Reply

from .conftest import API_KEY, scripted

MODEL = "gpt-test"


@pytest.fixture
def make_server():
    """Starts FakeOpenAI servers with the given settings; stops them all afterwards."""
    started = []

    def make(handler=scripted, **settings):
        srv = FakeOpenAI(handler, **settings).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


def client_for(server, **kw):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=5, **kw)


def request_line(custom_id, prompt, model=MODEL, url="/v1/chat/completions"):
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": model, "messages": [{"role": "user", "content": prompt}]},
    }


def jsonl(rows):
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def batch_input(n):
    return jsonl([request_line(f"req-{i}", f"question number {i}") for i in range(n)])


def start_batch(client, content, **kw):
    uploaded = client.files.create(file=("input.jsonl", content), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", **kw
    )


def poll_until_finished(client, batch_id, limit=20):
    """The statuses seen by successive retrieves, through the first finished one, and that batch."""
    statuses = []
    for _ in range(limit):
        batch = client.batches.retrieve(batch_id)
        statuses.append(batch.status)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return statuses, batch
    raise AssertionError(f"batch never finished: {statuses}")


def file_lines(client, file_id):
    return [json.loads(line) for line in client.files.content(file_id).text.split("\n") if line]


def test_upload_retrieve_content_list_and_delete_round_trip(make_server, tmp_path):
    server = make_server()
    client = client_for(server)
    content = batch_input(3)
    uploaded = client.files.create(file=("input.jsonl", content), purpose="batch")
    assert uploaded.id.startswith("file-")
    assert (uploaded.object, uploaded.bytes, uploaded.filename, uploaded.purpose, uploaded.status) == (
        "file",
        len(content),
        "input.jsonl",
        "batch",
        "processed",
    )
    assert uploaded.created_at > 0 and uploaded.expires_at > uploaded.created_at

    assert client.files.retrieve(uploaded.id) == uploaded
    assert client.files.content(uploaded.id).content == content  # byte for byte
    assert [f.id for f in client.files.list()] == [uploaded.id]

    # A path and an open file upload too, named after themselves.
    path = tmp_path / "from_disk.jsonl"
    path.write_bytes(content)
    assert client.files.create(file=path, purpose="batch").filename == "from_disk.jsonl"
    with path.open("rb") as handle:
        assert client.files.content(client.files.create(file=handle, purpose="batch").id).content == content
    assert len(server.files()) == 3

    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (uploaded.id, True, "file")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_upload_with_chunked_transfer_encoding(make_server):
    class UnsizedStream(io.BytesIO):
        """A file whose length httpx cannot learn up front, so it sends the body chunked."""

        name = "streamed.jsonl"

        def tell(self):
            raise io.UnsupportedOperation

    server = make_server()
    content = batch_input(2)
    uploaded = client_for(server).files.create(file=UnsizedStream(content), purpose="batch")
    assert server.requests[-1].headers.get("transfer-encoding") == "chunked"
    assert server.file_content(uploaded.id) == content


@pytest.mark.parametrize(
    "filename, content, says",
    [
        ("input.jsonl", b"{not json}\n", "Line 1"),
        (
            "input.jsonl",
            jsonl([{"method": "POST", "url": "/v1/chat/completions", "body": {"model": MODEL}}]),
            "custom_id",
        ),
        ("input.jsonl", jsonl([request_line("a", "x"), {**request_line("b", "y"), "method": "GET"}]), "method"),
        ("input.jsonl", jsonl([request_line("a", "x"), {**request_line("b", "y"), "body": "text"}]), "body"),
        ("input.jsonl", jsonl([request_line("same", "x"), request_line("same", "y")]), "custom_id"),
        ("input.jsonl", b"\n", "empty"),
        ("input.txt", batch_input(1), ".jsonl"),
    ],
)
def test_invalid_batch_uploads_are_rejected_with_400(make_server, filename, content, says):
    server = make_server()
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(server).files.create(file=(filename, content), purpose="batch")
    assert caught.value.status_code == 400
    assert says in caught.value.body["message"]
    assert server.files() == []


def test_unknown_purpose_is_rejected(make_server):
    with pytest.raises(openai.BadRequestError):
        client_for(make_server()).files.create(file=("a.jsonl", b"{}"), purpose="nonsense")


def test_batch_completes_with_scripted_answers_and_usage(make_server):
    server = make_server()
    client = client_for(server)
    content = batch_input(4)
    created = start_batch(client, content, metadata={"run": "r1"})
    assert created.id.startswith("batch_")
    assert (created.object, created.status, created.endpoint, created.completion_window, created.model) == (
        "batch",
        "validating",
        "/v1/chat/completions",
        "24h",
        MODEL,
    )
    assert created.request_counts.total == 0 and created.output_file_id is None and created.error_file_id is None
    assert created.metadata == {"run": "r1"} and created.expires_at == created.created_at + 24 * 3600

    first = client.batches.retrieve(created.id)
    assert first.status == "in_progress" and first.in_progress_at is not None
    assert (first.request_counts.total, first.request_counts.completed, first.output_file_id) == (4, 2, None)

    statuses, done = poll_until_finished(client, created.id)
    assert statuses == ["completed"]
    assert done.completed_at is not None and done.finalizing_at is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 4, 0)
    assert done.error_file_id is None
    output_file = client.files.retrieve(done.output_file_id)
    assert (output_file.purpose, output_file.filename) == ("batch_output", f"{done.id}_output.jsonl")

    lines = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(4)]
    for i, line in enumerate(lines):
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
        completion = openai.types.chat.ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == MODEL
        assert completion.choices[0].message.content == "Answer: " + f"question number {i}"[-60:]
        assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    assert done.usage.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in lines)
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens

    assert server.chat_requests() == []  # batch lines are not online chat calls
    assert [r.path for r in server.requests][:2] == ["/v1/files", "/v1/batches"]
    assert server.batches()[0]["status"] == "completed"
    assert API_KEY not in json.dumps(server.batches()) + json.dumps(server.files())
    assert client.batches.retrieve(done.id) == done  # finished batches stay put


def test_a_line_holding_unicode_line_separators_is_one_request(make_server):
    client = client_for(make_server())
    prompt = "one\u2028two\u0085three\x1cfour"  # str.splitlines would cut at each of these
    content = json.dumps(request_line("req-0", prompt), ensure_ascii=False).encode() + b"\n"
    _, done = poll_until_finished(client, start_batch(client, content).id)
    assert (done.status, done.request_counts.total, done.request_counts.completed) == ("completed", 1, 1)
    (line,) = file_lines(client, done.output_file_id)
    assert line["response"]["body"]["choices"][0]["message"]["content"] == "Answer: " + prompt[-60:]


def test_more_polls_show_finalizing(make_server):
    server = make_server(batch_polls_to_finish=4)
    client = client_for(server)
    batch = start_batch(client, batch_input(3))
    statuses, done = poll_until_finished(client, batch.id)
    assert statuses == ["in_progress", "in_progress", "finalizing", "completed"]
    assert done.request_counts.completed == 3


def test_one_poll_finishes_at_once(make_server):
    client = client_for(make_server(batch_polls_to_finish=1))
    statuses, done = poll_until_finished(client, start_batch(client, batch_input(2)).id)
    assert statuses == ["completed"] and done.request_counts.completed == 2


def test_per_request_errors_land_in_the_error_file(make_server):
    def handler(request):
        if request.custom_id == "req-1":
            return Reply.error(400, "context too long", code="context_length_exceeded")
        if request.custom_id == "req-2":
            return Reply(status=500)
        return scripted(request)

    server = make_server(handler)
    client = client_for(server)
    statuses, done = poll_until_finished(client, start_batch(client, batch_input(4)).id)
    assert statuses[-1] == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
    assert [line["custom_id"] for line in file_lines(client, done.output_file_id)] == ["req-0", "req-3"]

    errors = {line["custom_id"]: line for line in file_lines(client, done.error_file_id)}
    assert errors.keys() == {"req-1", "req-2"}
    assert errors["req-1"]["response"]["status_code"] == 400
    assert errors["req-1"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    assert errors["req-1"]["error"] is None
    assert errors["req-2"]["response"]["status_code"] == 500
    assert errors["req-2"]["response"]["body"]["error"]["message"]


def test_all_requests_failing_leaves_no_output_file(make_server):
    client = client_for(make_server(lambda request: Reply.error(429, "quota")))
    _, done = poll_until_finished(client, start_batch(client, batch_input(2)).id)
    assert done.status == "completed" and done.output_file_id is None and done.error_file_id is not None


def test_faults_are_ignored_for_batch_lines(make_server):
    client = client_for(make_server(lambda request: Reply(content="fine", delay=30, hang=True, reset=True)))
    _, done = poll_until_finished(client, start_batch(client, batch_input(2)).id)
    assert [
        line["response"]["body"]["choices"][0]["message"]["content"] for line in file_lines(client, done.output_file_id)
    ] == ["fine", "fine"]


def test_expired_batch_keeps_partial_output(make_server):
    server = make_server(batch_expire_after=3)
    client = client_for(server)
    statuses, done = poll_until_finished(client, start_batch(client, batch_input(5)).id)
    assert statuses == ["in_progress", "expired"]
    assert done.expired_at is not None and done.completed_at is None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 3, 0)
    assert [line["custom_id"] for line in file_lines(client, done.output_file_id)] == ["req-0", "req-1", "req-2"]
    assert done.error_file_id is None  # the unanswered two are simply absent


def test_expired_batch_can_report_unexecuted_requests(make_server):
    client = client_for(make_server(batch_expire_after=1, batch_report_unexecuted=True))
    _, done = poll_until_finished(client, start_batch(client, batch_input(3)).id)
    assert done.status == "expired"
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    errors = file_lines(client, done.error_file_id)
    assert [line["custom_id"] for line in errors] == ["req-1", "req-2"]
    assert all(line["response"] is None and line["error"]["code"] == "batch_expired" for line in errors)


def test_cancel_keeps_partial_output(make_server):
    server = make_server(batch_polls_to_finish=3)
    client = client_for(server)
    batch = start_batch(client, batch_input(4))
    assert client.batches.retrieve(batch.id).status == "in_progress"  # answers the first half

    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    assert client.batches.cancel(batch.id).status == "cancelling"  # cancelling twice is harmless

    statuses, done = poll_until_finished(client, batch.id)
    assert statuses == ["cancelled"] and done.cancelled_at is not None
    assert (done.request_counts.total, done.request_counts.completed) == (4, 2)
    assert [line["custom_id"] for line in file_lines(client, done.output_file_id)] == ["req-0", "req-1"]
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_cancel_before_any_retrieve_answers_nothing(make_server):
    server = make_server()
    client = client_for(server)
    batch = start_batch(client, batch_input(2))
    client.batches.cancel(batch.id)
    _, done = poll_until_finished(client, batch.id)
    assert done.status == "cancelled" and done.output_file_id is None and done.error_file_id is None
    assert done.request_counts.completed == 0


def test_failed_validation(make_server):
    client = client_for(make_server(batch_fail_validation=True))
    statuses, done = poll_until_finished(client, start_batch(client, batch_input(2)).id)
    assert statuses == ["failed"] and done.failed_at is not None
    assert done.errors.data and done.errors.data[0].message
    assert done.output_file_id is None and done.request_counts.total == 0


def test_lines_for_another_endpoint_or_model_fail_validation(make_server):
    client = client_for(make_server())
    content = jsonl(
        [
            request_line("a", "x"),
            request_line("b", "y", url="/v1/embeddings"),
            request_line("c", "z", model="other-model"),
        ]
    )
    _, done = poll_until_finished(client, start_batch(client, content).id)
    assert done.status == "failed"
    assert {(e.code, e.line) for e in done.errors.data} == {("invalid_url", 2), ("mismatched_model", None)}


def test_create_rejects_unknown_file_and_unsupported_endpoint(make_server):
    client = client_for(make_server())
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h")
    uploaded = client.files.create(file=("input.jsonl", batch_input(1)), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    other = client.files.create(file=("notes.jsonl", b"anything"), purpose="user_data")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=other.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_unknown_ids_are_404(make_server):
    client = client_for(make_server())
    calls = [
        lambda: client.files.retrieve("file-nope"),
        lambda: client.files.content("file-nope"),
        lambda: client.files.delete("file-nope"),
        lambda: client.batches.retrieve("batch_nope"),
        lambda: client.batches.cancel("batch_nope"),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.status_code == 404 and "nope" in caught.value.body["message"]


def test_list_batches_newest_first_with_limit_and_after(make_server):
    client = client_for(make_server())
    ids = [start_batch(client, batch_input(1)).id for _ in range(3)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == [ids[2], ids[1]] and page.has_more
    assert [b.id for b in client.batches.list(limit=2, after=ids[1]).data] == [ids[0]]
    assert [b.id for b in client.batches.list(limit=1)] == ids[::-1]  # the SDK follows the cursor


def test_async_client_end_to_end(make_server):
    server = make_server()

    async def go():
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as client:
            uploaded = await client.files.create(file=("input.jsonl", batch_input(2)), purpose="batch")
            batch = await client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            while batch.status not in ("completed", "failed", "expired", "cancelled"):
                batch = await client.batches.retrieve(batch.id)
            content = await client.files.content(batch.output_file_id)
            listed = [b.id async for b in client.batches.list()]
            return batch, content.text, listed

    batch, text, listed = asyncio.run(go())
    assert batch.status == "completed" and listed == [batch.id]
    assert [json.loads(line)["custom_id"] for line in text.splitlines()] == ["req-0", "req-1"]


def test_online_chat_still_works_beside_batches(make_server):
    server = make_server()
    client = client_for(server)
    _, done = poll_until_finished(client, start_batch(client, batch_input(1)).id)
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}])
    assert answer.choices[0].message.content == "Answer: hello"
    assert len(server.chat_requests()) == 1
