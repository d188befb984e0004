"""What the viewer shows, from the stage files alone: every sample of every run, each benchmark's summary; a
damaged or unfinished folder read as far as it goes (docs/viewer.md#partial-and-damaged-outputs)."""

import base64
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...results import discover, stats
from ...results.figures import headline
from ...results.items import ItemFigure
from ...store import jsonl, manifest, paths, shards
from ..shapes import Shape, as_text, row_id

PREVIEW_CHARS = 80  # of an answer, shown in the sample list
NO_JUDGE = "no judge row"  # the status of a sample that has an answer but no grade yet


def scan(
    path: Path, where: str, notes: list[str], skip: Collection[str] = frozenset(), skipped: set | None = None
) -> Iterator[dict]:
    """A run file's rows over its parts, damage and running writers noted in `notes`; whole lines whose id is in
    `skip` go unparsed into `skipped`."""
    for part in [path, *shards.shard_files(path).values()]:
        pid = _writer_alive(part.with_name(f"{part.name}.lock"))
        if pid is not None:
            notes.append(f"{where}/{part.name}: being written by a running stage (pid {pid}): this is a snapshot")
        bad: list[int] = []  # line numbers that are not JSON objects
        torn = False  # a last line without newline that is not JSON (a write cut short, or in progress)
        try:
            f = open(part, "rb")
        except OSError:
            continue
        with f:
            for lineno, raw in enumerate(f, 1):
                if skip and raw.endswith(b"\n"):
                    fast = jsonl.fast_id(raw)
                    if fast is not None and fast in skip:
                        if skipped is not None:
                            skipped.add(fast)
                        continue
                try:
                    row = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    if not raw.strip():
                        continue
                    torn = not raw.endswith(b"\n")
                    row = None
                if type(row) is dict:
                    yield row
                elif not torn:
                    bad.append(lineno)
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (" …" if len(bad) > 5 else "")
            notes.append(f"{where}/{part.name}: {len(bad)} line(s) are not JSON rows and were skipped (line {shown})")
        if torn:
            notes.append(
                f"{where}/{part.name}: the last line is incomplete (a write cut short, or still being written); ignored"
            )


class Texts:
    """Each distinct long text once; texts above `cap` characters are cut to a head and a tail."""

    def __init__(self, cap: int | None):
        self.cap = cap
        self.items: list[str] = []
        self.full_chars: list[int] = []  # each text's length before any cut
        self._ids: dict[str, int] = {}

    def ref(self, text: str) -> int | str:
        if len(text) <= 160:  # a short text stays in the sample
            return text
        found = self._ids.get(text)
        if found is None:
            found = self._ids[text] = len(self.items)
            self.full_chars.append(len(text))
            cap = self.cap
            if cap is not None and len(text) > cap:  # cut to a head and a tail
                head = cap * 3 // 4
                cut = f"[… {len(text) - cap:,} characters not embedded in this report (--context-chars {cap:,}) …]"
                text = f"{text[:head]}\n\n{cut}\n\n{text[len(text) - cap + head :]}"
            self.items.append(text)
        return found

    def cut_summary(self) -> dict:
        cap = self.cap
        omitted = [n - cap for n in self.full_chars if cap is not None and n > cap]
        return dict(
            cap=cap,
            texts=len(self.items),
            texts_cut=len(omitted),
            chars_total=sum(self.full_chars),
            chars_omitted=sum(omitted),
        )


# the row's keys shown as they are: the answer's call, the grade, the judge's call
DETAIL_KEYS = (
    *("status", "error", "finish_reason", "usage", "latency_s", "batch", "calls"),
    *("answer", "target", "prediction", "parse_mode", "correct", "normalized_correct", "requirement_status"),
    *(f"judge_{k}" for k in "status salvage notes error model usage latency_s attempts batch".split()),
)
_SHOWN = {"idx", "messages", "model_output", "rubrics", "metadata", "model", "grading_rationale", "score", "thinking"}
_SHOWN.update(DETAIL_KEYS)
ANALYSIS_KEYS = ("error_types", "error_reason", *(f"analysis_{k}" for k in "status error model attempts".split()))


def rubric_texts(rubrics: Any) -> list[str]:
    rubrics = rubrics if isinstance(rubrics, list) else []
    return [as_text(r.get("rubric_criteria", "") if isinstance(r, dict) else r).strip() for r in rubrics]


def passed(row: dict) -> int:
    """1 or 0 from a judge row's score (anything but a clear 1, 1.0, "1" or true is a fail)."""
    return 1 if row.get("score") in (1, "1") else 0


def sample_from(row: dict, judged: bool, shape: Shape, texts: Texts) -> dict:
    """A compact sample: the index fields the list filters on, and the detail shown when it is opened."""
    answer = as_text(row.get("model_output"))
    detail: dict[str, Any] = {"output": answer}
    thought = row.get("thinking")
    if isinstance(thought, str) and thought:  # a reasoning model's thinking, shown folded above the answer
        detail["thinking"] = texts.ref(thought)
    if "messages" in row:
        messages = [m for m in row["messages"] or [] if isinstance(m, dict)]
        detail["messages"] = [[as_text(m.get("role")), texts.ref(as_text(m.get("content")))] for m in messages]
    else:
        detail["slim"] = True  # written with --slim: the conversation is not in the rows
    rubrics = rubric_texts(row.get("rubrics"))
    if rubrics:
        detail["rubrics"] = rubrics
    if judged and "grading_rationale" in row:
        detail["rationale"] = as_text(row["grading_rationale"])
    if isinstance(row.get("metadata"), dict):
        detail["metadata"] = row["metadata"]
    detail.update((key, row[key]) for key in DETAIL_KEYS if key in row)
    extra = {k: v for k, v in row.items() if k not in _SHOWN and not k.startswith("analysis_")}
    if extra:
        detail["extra"] = extra
    shape.detail(row, detail)
    preview = " ".join(shape.preview(row, answer)[: PREVIEW_CHARS * 2].split())[:PREVIEW_CHARS]
    f1, f2, group = shape.facet_values(row)
    status = as_text(row.get("judge_status") or "ok") if judged else NO_JUDGE
    return {
        "id": row_id(row),
        "f1": f1,
        "f2": f2,
        "group": group,
        "pass": passed(row) if judged else -1,
        "status": status,
        "errors": [],
        "preview": preview,
        "detail": detail,
    }


@dataclass
class Run:
    model: str
    k: int
    samples: list[dict] = field(default_factory=list)
    infer_rows: int = 0
    judge_rows: int = 0
    analysis_rows: int = 0
    expected: int | None = None
    score: dict | None = None
    problems: list[str] = field(default_factory=list)


def _expected(folder: Path, score: dict | None) -> int | None:
    """The selected task count: score.json's coverage, else the sum of the infer manifests' (None: not known)."""
    coverage = (score or {}).get("coverage")
    if isinstance(coverage, dict) and isinstance(coverage.get("expected"), int):
        return coverage["expected"]
    infer = folder / "infer.jsonl"
    found = shards.shard_files(infer)
    if not infer.exists() and found and len(found) < next(iter(found)).n:
        return None  # a shard not started yet: its count is not known
    total = 0
    for part in [infer] if infer.exists() or not found else found.values():
        record = _read_json(manifest.path_for(part))
        counts = record.get("counts") if isinstance(record, dict) else None
        selected = counts.get("selected") if isinstance(counts, dict) else None  # a damaged manifest: not known
        if not isinstance(selected, int):
            return None
        total += selected
    return total


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _writer_alive(lock: Path) -> int | None:
    """The pid in `<file>.lock` if it is still an evalpipe stage (only read: taking the lock could make a run exit)."""
    try:
        pid = int(lock.read_text().strip() or "0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if pid > 0 else b""
    except (OSError, ValueError):
        return None
    return pid if any(w in cmdline for w in (b"infer", b"judge", b"evalpipe")) else None


def read_run(bench: str, model: str, k: int, folder: Path, shape: Shape, texts: Texts) -> Run:
    run = Run(model, k)
    where = f"{bench}/{model}/run-{k}"
    infer_path, judge_path = folder / "infer.jsonl", folder / "judge.jsonl"
    judged, answers = shards.exists(judge_path), shards.exists(infer_path)
    by_id = {row_id(row): sample_from(row, True, shape, texts) for row in scan(judge_path, where, run.problems)}
    run.judge_rows = len(by_id)
    if answers and not judged:
        run.problems.append(f"{where}: no judge.jsonl yet (answers shown ungraded; run judge)")
    elif judged and not answers:
        run.problems.append(f"{where}: no infer.jsonl (judge rows shown alone)")
    judged_ids = set(by_id)
    # every answer counts once; only those without a judge row are parsed (the others are skipped by id)
    answered: set[str] = set()
    for row in scan(infer_path, where, run.problems, judged_ids, answered):
        task = row_id(row)
        answered.add(task)
        if task not in judged_ids:
            by_id[task] = sample_from(row, False, shape, texts)
    run.infer_rows = len(answered)
    if judged and len(by_id) > len(judged_ids):
        run.problems.append(f"{where}: {len(by_id) - len(judged_ids)} answer(s) have no judge row yet (run judge)")
    analysis_path = paths.error_analysis_path(judge_path, "error_analysis")
    for row in scan(analysis_path, where, run.problems):
        run.analysis_rows += 1
        analysed = by_id.get(row_id(row))
        if analysed is not None:
            types = row.get("error_types")
            analysed["errors"] = [as_text(t) for t in types] if isinstance(types, list) else []
            analysed["detail"]["analysis"] = {key: row[key] for key in ANALYSIS_KEYS if key in row}
    score_path = folder / "score.json"
    if score_path.exists():
        run.score = _read_json(score_path)
        if not isinstance(run.score, dict):
            run.score = None
            run.problems.append(f"{where}/score.json: not valid JSON; ignored")
        elif judged and max(p.stat().st_mtime for p in shards.parts(judge_path)) > score_path.stat().st_mtime + 1:
            run.problems.append(f"{where}: judge.jsonl changed after score.json was written (run score again)")
    elif judged:
        run.problems.append(f"{where}: no score.json yet (run score)")
    run.expected = _expected(folder, run.score)
    if run.expected is not None and len(by_id) < run.expected:
        run.problems.append(
            f"{where}: {run.expected - len(by_id)} of {run.expected} selected tasks have no row on disk yet"
        )
    run.samples = list(by_id.values())
    return run


def is_run_dir(p: Path) -> bool:
    return any(shards.exists(p / f) for f in ("infer.jsonl", "judge.jsonl", "score.json"))


def _figures_from_scores(declared: Sequence[ItemFigure], runs: list[Run]) -> list[dict]:
    """Without aggregate.json: each model's headline figures, mean ± sample std over its runs' score.json."""
    per_model: dict[str, list[dict]] = {}
    for run in runs:
        if run.score is not None:
            try:
                per_model.setdefault(run.model, []).append(headline(declared, run.score))
            except (KeyError, TypeError, AttributeError):
                continue
    models = []
    for model, values in sorted(per_model.items()):
        figures = {}
        for name in values[0]:
            series = [v[name] for v in values if isinstance(v.get(name), (int, float))]
            if series:
                figures[name] = {
                    "mean": stats.mean(series),
                    "std_sample": stats.std(series, "sample"),
                    "n": len(series),
                    "values": series,
                }
        models.append({"model": model, "runs": len(values), "figures": figures})
    return models


_FIGURE_KEYS = ("mean", "std_sample", "std_population", "stderr", "ci95", "n", "values", "items")


def _slim_figures(figures: Any) -> dict:
    if not isinstance(figures, dict):
        return {}
    return {
        str(name): {k: f[k] for k in _FIGURE_KEYS if k in f}
        for name, f in figures.items()
        if isinstance(f, dict) and isinstance(f.get("mean"), (int, float))
    }


def _model(m: dict) -> dict:
    runs = m.get("runs")
    return {
        "model": as_text(m.get("model")),
        "runs": len(runs) if isinstance(runs, list) else runs,
        "figures": _slim_figures(m.get("figures")),
        "extra_tables": {
            str(t): _slim_figures(f) for t, f in (m.get("extra_tables") or {}).items() if isinstance(f, dict)
        },
        "flagged": bool(m.get("flagged")),
        "cost_usd_per_run": m.get("cost_usd_per_run"),
    }


def leaderboard(bench_dir: Path, declared: Sequence[ItemFigure], runs: list[Run], problems: list[str]) -> dict:
    """The leaderboard from aggregate.json, else from the runs' score.json (the `declared` figures' headline values)."""
    path = bench_dir / "aggregate.json"
    data, source = _read_json(path), "aggregate.json"
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        problems.append(
            f"{bench_dir.name}: no aggregate.json"
            + (" (not valid JSON)" if path.exists() else "")
            + ": the figures below are computed from the runs' score.json (run make report or aggregate)"
        )
        source, data = "score.json", {"models": _figures_from_scores(declared, runs)}
    return {
        "source": source,
        "models": [_model(m) for m in data["models"] if isinstance(m, dict)],
        "comparisons": [c for c in data.get("comparisons") or [] if isinstance(c, dict)],
        "warnings": [as_text(w) for w in data.get("warnings") or []],
        "notes": _notes(data),
        "std_shown": as_text(data.get("std_shown") or "sample"),
    }


def _notes(data: dict) -> list[str]:
    """How to read the figures: aggregate.json's `methods` (by name), its `notes`, or its older `ci95` note."""
    methods, notes = data.get("methods"), data.get("notes")
    out = [as_text(v) for v in (methods.values() if isinstance(methods, dict) else [methods]) if v]
    out += [as_text(n) for n in (notes if isinstance(notes, list) else [notes]) if n]
    if isinstance(data.get("ci95"), str) and not isinstance(methods, dict):
        out.append(data["ci95"])
    return out


def plots(bench_dir: Path, problems: list[str]) -> list[dict]:
    out = []
    for png in sorted(bench_dir.glob("aggregate*.png")):
        try:
            data = png.read_bytes()
        except OSError:
            continue
        if len(data) > 2_000_000 or not data.startswith(b"\x89PNG"):
            problems.append(f"{bench_dir.name}/{png.name}: not embedded (too large or not a PNG)")
            continue
        out.append({"name": png.name, "src": "data:image/png;base64," + base64.b64encode(data).decode()})
    return out


def read_bench(root: Path, bench: str, shape: Shape, texts: Texts) -> tuple[dict, list[Run]]:
    bench_dir = root / bench
    runs = [
        read_run(bench, model, k, folder, shape, texts) for model, k, folder in discover.runs(bench_dir, is_run_dir)
    ]
    problems = [p for run in runs for p in run.problems]
    summary = {
        "bench": bench,
        "kind": shape.kind,
        "facets": list(shape.facets),
        "leaderboard": leaderboard(bench_dir, shape.figures, runs, problems),
        "plots": plots(bench_dir, problems),
        "problems": problems,
    }
    return summary, runs
