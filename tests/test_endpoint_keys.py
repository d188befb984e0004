"""A key goes only to the host it was given for: <P>_API_KEY to <P>_BASE_URL's origin (OpenAI's when
unset), --api-key wherever it is pointed. Two loopback servers, A (OPENAI_BASE_URL, holding
OPENAI_API_KEY) and B (another port); every request's headers are recorded, so each test can show
which key reached which server, and that a refused stage sent nothing at all."""

import asyncio
import os
import subprocess
import sys

import openai
import pytest

from evalpipe import cli
from evalpipe.client.llm import Endpoint
from evalpipe.devtools.testserver import FakeOpenAI
from evalpipe.errors import BadInput
from evalpipe.stages import infer as infer_stage

from .conftest import API_KEY, ROOT, read_jsonl, scripted
from .test_results import with_analyst

JUDGE_KEY = "sk-judge-OTHER-fedcba9876543210"
EXPLICIT_KEY = "sk-explicit-THIRD-0011223344"
KEYS = (API_KEY, JUDGE_KEY, EXPLICIT_KEY)


@pytest.fixture
def other():
    srv = FakeOpenAI(scripted).start()
    yield srv
    srv.stop()


def keys_received(server) -> set[str]:
    return {r.headers.get("authorization") for r in server.requests}


def assert_no_key_in(proc):
    for key in KEYS:
        assert key not in proc.stdout and key not in proc.stderr


def inferred(stage, samples=2):
    stage.infer("--max-samples", samples, check=0)


def judge(stage, *flags, check=None):
    return stage("judge", "--input", "infer.jsonl", "--judge-model", "j", *flags, check=check)


# ---------------------------------------------------------------- judge


@pytest.mark.e2e
def test_judge_never_sends_the_openai_key_to_the_judge_host(server, other, stage):
    inferred(stage)
    before = len(server.requests)
    stage.env["JUDGE_BASE_URL"] = other.base_url
    proc = judge(stage)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"judge: error: JUDGE_BASE_URL points to {other.base_url} but JUDGE_API_KEY is not set; the key in "
        f"OPENAI_API_KEY belongs to {server.base_url} and is not sent to another host: set JUDGE_API_KEY "
        "(any value for a server that needs no key) or pass --api-key"
    ]
    assert other.requests == [] and len(server.requests) == before
    assert_no_key_in(proc)


@pytest.mark.e2e
def test_judge_sends_the_judge_key_to_the_judge_host_only(server, other, stage, tmp_path):
    inferred(stage)
    before = len(server.requests)
    stage.env.update(JUDGE_BASE_URL=other.base_url, JUDGE_API_KEY=JUDGE_KEY)
    assert_no_key_in(judge(stage, check=0))
    assert len(read_jsonl(tmp_path / "judge.jsonl")) == 2
    assert other.chat_requests() and keys_received(other) == {f"Bearer {JUDGE_KEY}"}
    assert len(server.requests) == before  # nothing of the judge's went to A


@pytest.mark.e2e
def test_judge_key_without_judge_base_url_is_not_sent_to_openai_base_url(server, stage):
    inferred(stage)
    before = len(server.requests)
    stage.env["JUDGE_API_KEY"] = JUDGE_KEY  # meant for OpenAI; the URL would fall back to A
    proc = judge(stage)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert (
        f"OPENAI_BASE_URL points to {server.base_url} but JUDGE_BASE_URL is not set; the key in JUDGE_API_KEY "
        "belongs to https://api.openai.com/v1"
    ) in proc.stderr
    assert len(server.requests) == before
    assert_no_key_in(proc)


@pytest.mark.e2e
def test_judge_on_the_same_origin_as_the_openai_key_may_use_it(server, stage):
    inferred(stage)
    stage.env["JUDGE_BASE_URL"] = server.base_url + "/"  # another spelling, the same scheme, host and port
    judge(stage, check=0)
    assert keys_received(server) == {f"Bearer {API_KEY}"}


@pytest.mark.e2e
def test_judge_with_an_explicit_key_goes_where_pointed(server, other, stage):
    inferred(stage)
    stage.env["JUDGE_BASE_URL"] = other.base_url
    judge(stage, "--api-key", EXPLICIT_KEY, check=0)
    assert keys_received(other) == {f"Bearer {EXPLICIT_KEY}"}


# ---------------------------------------------------------------- infer


@pytest.mark.e2e
def test_infer_refuses_a_base_url_elsewhere_than_the_env_key_belongs(server, other, stage):
    proc = stage.infer("--base-url", other.base_url)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"infer: error: --base-url points to {other.base_url}; the key in OPENAI_API_KEY belongs to "
        f"{server.base_url} and is not sent to another host: pass its key with --api-key "
        "(any value for a server that needs no key)"
    ]
    assert other.requests == [] and server.requests == []
    assert_no_key_in(proc)


@pytest.mark.e2e
def test_infer_refuses_when_the_key_belongs_to_openai(other, stage):
    del stage.env["OPENAI_BASE_URL"]  # OPENAI_API_KEY is then OpenAI's
    proc = stage.infer("--base-url", other.base_url)
    assert proc.returncode == 2 and "belongs to https://api.openai.com/v1" in proc.stderr
    assert other.requests == []
    assert_no_key_in(proc)


@pytest.mark.e2e
def test_infer_with_an_explicit_key_goes_where_pointed(server, other, stage):
    stage.infer("--max-samples", 2, "--base-url", other.base_url, "--api-key", EXPLICIT_KEY, check=0)
    assert keys_received(other) == {f"Bearer {EXPLICIT_KEY}"} and server.requests == []


@pytest.mark.e2e
def test_infer_on_the_same_origin_keeps_the_env_key(server, stage):
    stage.infer("--max-samples", 2, "--base-url", server.base_url + "/", check=0)
    assert keys_received(server) == {f"Bearer {API_KEY}"}


@pytest.mark.e2e
def test_no_key_anywhere_sends_a_placeholder_to_a_local_server(other, stage):
    del stage.env["OPENAI_API_KEY"]
    stage.infer("--max-samples", 2, "--base-url", other.base_url, check=0)
    assert keys_received(other) == {"Bearer no-key"}


# ---------------------------------------------------------------- batch backend and error analysis


@pytest.mark.e2e
def test_batch_backend_follows_the_same_rule(server, other, stage, tmp_path):
    inferred(stage)
    before = len(server.requests)
    stage.env["JUDGE_BASE_URL"] = other.base_url
    batch = ("--backend", "batch", "--batch-wait", "30", "--batch-poll", "0.05")
    refused = judge(stage, *batch)
    assert refused.returncode == 2 and "JUDGE_API_KEY is not set" in refused.stderr
    assert other.requests == [] and len(server.requests) == before
    assert_no_key_in(refused)

    other.batch_polls_to_finish = 1
    stage.env["JUDGE_API_KEY"] = JUDGE_KEY
    assert_no_key_in(judge(stage, *batch, check=0))
    assert other.batches() and keys_received(other) == {f"Bearer {JUDGE_KEY}"}
    assert len(server.requests) == before
    assert len(read_jsonl(tmp_path / "judge.jsonl")) == 2

    proc = stage("infer", "--model", "m", "--output", "more.jsonl", "--base-url", other.base_url, *batch)
    assert proc.returncode == 2 and "--base-url points to" in proc.stderr
    assert keys_received(other) == {f"Bearer {JUDGE_KEY}"}


@pytest.mark.e2e
def test_error_analysis_follows_the_same_rule(server, other, stage):
    server.handler = other.handler = with_analyst()
    inferred(stage, samples=12)
    judge(stage, check=0)
    before = len(server.requests)
    analysis = ("judge", "--input", "judge.jsonl", "--judge-model", "j", "--error-analysis")
    stage.env["JUDGE_BASE_URL"] = other.base_url
    refused = stage(*analysis)
    assert refused.returncode == 2 and "JUDGE_API_KEY is not set" in refused.stderr
    assert other.requests == []
    assert_no_key_in(refused)

    stage.env["JUDGE_API_KEY"] = JUDGE_KEY
    assert_no_key_in(stage(*analysis, check=0))
    assert other.chat_requests() and keys_received(other) == {f"Bearer {JUDGE_KEY}"}
    assert len(server.requests) == before


# ---------------------------------------------------------------- what the SDK would take from the environment


def endpoint_for(*argv) -> Endpoint:
    _, args = cli.parser_for("infer", "", infer_stage._add_args, ["--model", "m", *argv])
    return cli.endpoint_from_args(args, "m")


def send_with_sdk_options(endpoint: Endpoint) -> None:
    async def send():
        client = openai.AsyncOpenAI(**endpoint.sdk_options(), max_retries=0, timeout=10)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await client.close()

    asyncio.run(send())


@pytest.fixture
def sdk_environment(monkeypatch, server):
    for name in [n for n in os.environ if n.startswith(("OPENAI_", "JUDGE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENAI_ORG_ID", "org-team")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-team")
    monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", f"Authorization: Bearer {JUDGE_KEY}\nX-Team-Token: t0ken")


def test_sdk_environment_headers_go_only_where_the_openai_key_belongs(sdk_environment, server, other):
    send_with_sdk_options(endpoint_for())
    home = server.requests[-1].headers
    assert home["authorization"] == f"Bearer {API_KEY}"  # the chosen key, not OPENAI_CUSTOM_HEADERS' one
    assert (home["openai-organization"], home["openai-project"], home["x-team-token"]) == (
        "org-team",
        "proj-team",
        "t0ken",
    )

    send_with_sdk_options(endpoint_for("--base-url", other.base_url, "--api-key", EXPLICIT_KEY))
    away = other.requests[-1].headers
    assert away["authorization"] == f"Bearer {EXPLICIT_KEY}"
    assert not {"openai-organization", "openai-project", "x-team-token"} & set(away)


def test_the_sdk_gets_an_explicit_url(sdk_environment, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL")
    endpoint = endpoint_for()
    assert endpoint.base_url is None and endpoint.base_url_source == "the default (OpenAI)"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # read by the SDK only when given no URL
    assert endpoint.sdk_options()["base_url"] == "https://api.openai.com/v1"


def test_base_url_source_names_where_the_url_came_from(sdk_environment, monkeypatch, server):
    assert endpoint_for().base_url_source == "OPENAI_BASE_URL"
    assert endpoint_for("--base-url", server.base_url).base_url_source == "--base-url"
    monkeypatch.setenv("JUDGE_BASE_URL", server.base_url)
    _, args = cli.parser_for("infer", "", infer_stage._add_args, ["--model", "m"])
    assert cli.endpoint_from_args(args, "j", env_prefix="JUDGE").base_url_source == "JUDGE_BASE_URL"


def test_a_refusal_never_shows_credentials_in_urls(sdk_environment, monkeypatch, other):
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://user:pa55word@127.0.0.1:9/v1?key={JUDGE_KEY}")
    with pytest.raises(BadInput) as refused:
        endpoint_for("--base-url", other.base_url)
    message = str(refused.value)
    assert "belongs to http://127.0.0.1:9/v1 " in message
    assert not any(secret in message for secret in ("pa55word", *KEYS))


def test_credentials_with_a_port_that_is_no_number_are_refused_as_bad_input(sdk_environment):
    with pytest.raises(BadInput) as refused:  # not a ValueError from making the message
        endpoint_for("--base-url", "http://user:pa55word@127.0.0.1:port/v1")
    assert "has credentials in it (http://USER:KEY@127.0.0.1/v1)" in str(refused.value)
    assert "pa55word" not in str(refused.value)


# ---------------------------------------------------------------- a key echoed back in an answer


def test_a_key_echoed_in_successful_answers_lands_in_no_row_report_or_upload(server, stage, tmp_path):
    """Issue 38 row 10: a server that echoes our key in its answers (content, reasoning, model, fingerprint): rows,
    score, report.md, report.html and what publish would upload hold no trace of it, not even a cut-off part."""
    from evalpipe.devtools.testserver import Reply
    from evalpipe.results import publish

    from .conftest import is_judge, judge_json, rubric_count

    echo = f"the key you sent is {API_KEY}."
    judged = []

    def echoing(request):
        if not is_judge(request):
            return Reply(content=echo, reasoning=echo, served_model=f"m-{API_KEY}", system_fingerprint=API_KEY)
        judged.append(request)
        if len(judged) == 1:
            return Reply(content="x" * 190 + API_KEY)  # no verdict: the row's error quotes the reply's first 200
        return Reply(content=judge_json(1, rubric_count(request.last_content), rationale=echo), served_model=API_KEY)

    server.handler = echoing
    out = tmp_path / "out"
    common = ("--bench", "clbench", "--model", "m", "--outputs-dir", out)
    stage("infer", *common, "--max-samples", 3, check=0)
    stage("judge", *common, "--judge-model", "j", "--parse-attempts", 1, check=0)
    stage("score", *common)
    for module in (["evalpipe.stages.report", "--outputs-dir", out], ["evalpipe.stages.viewer", out]):
        proc = subprocess.run([sys.executable, "-m", *map(str, module)], cwd=ROOT, env=stage.env, capture_output=True)
        assert proc.returncode == 0, proc.stderr
    written = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert any(p.name == "report.html" for p in written) and any(p.name == "judge.jsonl" for p in written)
    uploaded = publish.files(out, "clbench", with_prompts=True)
    for name, data in [*((str(p), d) for p, d in written.items()), *uploaded.items()]:
        assert API_KEY[:12].encode() not in data, name
    assert any(b"[REDACTED]" in data for data in written.values())
