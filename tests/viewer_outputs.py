"""An outputs folder for the viewer's tests, made by the real stages (in process) against the loopback server.

Three benchmarks, two models, two runs each; the model and the judge answer with HOSTILE strings in
some replies, and CL-bench's data has a long context shared by two tasks and hostile rubrics.
"""

import contextlib
import hashlib
import io
import json
import re
import struct
import zlib
from pathlib import Path

from evalpipe.benchmarks.error_recovery import FINAL_ANSWER_PROMPT
from evalpipe.devtools.fakeruns import HOSTILE
from evalpipe.devtools.testserver import FakeOpenAI, Reply
from evalpipe.errors import run_stage
from evalpipe.stages import aggregate, infer, judge, score

from .conftest import API_KEY, SAMPLE, rubric_count

LONG_CONTEXT_CHARS = 30_000
MODELS = ("alpha", "beta")
MARKER = "zebra-marker-"  # appears in exactly the answers the tests look for
THINKING = "thinking-marker-"  # begins the thinking of some CoinFlip replies (a reasoning model's, written inline)


def _digest(*parts: str) -> int:
    return int(hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8], 16)


def handler(request) -> Reply:
    model = (request.body or {}).get("model", "")
    prompt = request.last_content
    seed = _digest(model, json.dumps(request.messages, sort_keys=True))
    if "Response to grade:" in prompt:  # the CL-bench judge
        answer = prompt.split("<<<RESPONSE\n", 1)[1].split("\nRESPONSE>>>", 1)[0]
        n = rubric_count(prompt)
        passed = _digest(answer) % 2
        status = ["yes"] * n if passed else ["yes"] * (n - 1) + ["no"]
        rationale = f"checked {n} rubrics. " + (HOSTILE[seed % len(HOSTILE)] if seed % 3 == 0 else "fine")
        return Reply(
            content=json.dumps(
                {
                    "Grading Rationale": rationale,
                    "List of Requirement Satisfaction Status": status,
                    "Overall Score": passed,
                }
            )
        )
    if '"Error Types"' in prompt:  # the CL-bench error analysis
        kinds = ("Context Ignored", "Context Misused", "Format Error", "Refusal")
        return Reply(content=json.dumps({"Error Types": [kinds[seed % 4]], "Reason": "because " + HOSTILE[seed % 7]}))
    if "coin flip problem" in prompt:
        verdict = ("YES", "NO", "maybe")[seed % 3]
        extra = HOSTILE[seed % len(HOSTILE)] if seed % 4 == 0 else "tracking"
        thought = f"<think>{THINKING}{seed} The coin ends up... ANSWER: maybe</think>\n" if seed % 4 == 1 else ""
        return Reply(content=f"{thought}{extra}\n{MARKER}{model}-{seed % 5}\nANSWER: {verdict}")
    if FINAL_ANSWER_PROMPT in prompt:  # Error Recovery's extraction call
        return Reply(content=str(seed % 3 - 1))
    if request.messages and "reasoning" in str(request.messages[0].get("content", "")):  # Error Recovery's reasoning
        return Reply(content=f"Step by step for {model}: {seed % 97}")
    return Reply(content=f"Answer by {model}: {HOSTILE[seed % len(HOSTILE)]} {MARKER}{seed % 5} {prompt[-40:]}")


def clbench_data(path: Path) -> Path:
    """The bundled sample, with a long context shared by its first two tasks and hostile rubrics in the third."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    long_context = (
        "LONG CONTEXT START. " + ("All vessels need permits. " * (LONG_CONTEXT_CHARS // 26)) + " LONG CONTEXT END."
    )
    for row in rows[:2]:
        row["messages"][0]["content"] = long_context
        row["metadata"]["context_id"] = "shared-long-context"
    rows[2]["rubrics"] = [*rows[2]["rubrics"], *HOSTILE[:3]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0\0\0\0")) + chunk(b"IEND", b"")
    )


def _stage(name: str, main, argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = run_stage(name, main, argv)
    assert code in (0, 3), f"{name} {argv} exited {code}: {err.getvalue()[-2000:]}"
    return code


def build(root: Path) -> Path:
    """Write the outputs under root (also root/data/ for the datasets) and return root."""
    server = FakeOpenAI(handler).start()
    try:
        (root / "data").mkdir(parents=True, exist_ok=True)
        plans = {
            "clbench": (MODELS, ["--input", str(clbench_data(root / "data" / "clbench.jsonl"))]),
            "coin_flip": (MODELS, ["--max-samples", "20"]),
            "error_recovery": (MODELS[:1], []),
        }
        endpoint = ["--base-url", server.base_url, "--api-key", API_KEY, "--max-retries", "1", "--timeout", "10"]
        for bench, (models, infer_args) in plans.items():
            for model in models:
                for run in (1, 2):
                    where = ["--bench", bench, "--model", model, "--run", str(run), "--outputs-dir", str(root)]
                    _stage("infer", infer.main, [*where, *endpoint, *infer_args])
                    _stage("judge", judge.main, [*where, *endpoint, "--judge-model", "judge"])
                    if bench == "clbench" and model == MODELS[0]:
                        _stage("judge", judge.main, [*where, *endpoint, "--judge-model", "judge", "--error-analysis"])
                    _stage("score", score.main, where)
            _stage("aggregate", aggregate.main, ["--bench", bench, "--outputs-dir", str(root), "--no-plots"])
            (root / bench / "aggregate.png").write_bytes(tiny_png())
    finally:
        server.stop()
    return root


def rows(path: Path) -> dict[str, dict]:
    """The last row per task id of a JSONL file (as the stages and the viewer read it)."""
    out: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().split("\n"):  # not splitlines(): U+2028 inside a row is no line end
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                out[str(row["idx"])] = row
    return out


def samples(root: Path, bench: str) -> list[dict]:
    """Every sample the report should hold for one benchmark: judge rows, then answers not judged yet."""
    found = []
    for run_dir in sorted((root / bench).glob("*/run-*")):
        judged = rows(run_dir / "judge.jsonl")
        answered = rows(run_dir / "infer.jsonl")
        model, run = run_dir.parent.name, int(re.sub(r"\D", "", run_dir.name))
        for task, row in {**answered, **judged}.items():
            found.append({"model": model, "run": run, "id": task, "row": row, "judged": task in judged})
    return found
