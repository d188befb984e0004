"""Real datasets from the Hugging Face Hub (`make data`, `hf://` inputs), fetched once into data/hf/ and locked by
commit and sha256 (docs/usage.md#real-datasets-make-data-and-hf-inputs). Downloading needs the optional
huggingface_hub (requirements-data.txt); reading a fetched file does not."""

import argparse
import hashlib
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from pathlib import Path

import orjson

from ..errors import EXIT_UNREACHABLE, BadInput, StageError, run_stage
from ..store import jsonl, manifest
from ..store.paths import PROJECT

SCHEME = "hf://"
LOCK_NAME = "hf-lock.json"

# tencent/CL-bench's newest commit known offline ("Update README.md"); --revision (make data REVISION=...) takes another
CLBENCH_REVISION = "6f5df61d91c8f0e861b031f84cc1cb5bfbe4c20e"


@dataclass(frozen=True)
class Ref:
    """hf://<repo>[@<revision>]/<target>: a file path in a dataset repo, or a split name."""

    repo: str
    revision: str
    target: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.repo}@{_quoted(self.revision)}/{self.target}"


# Where each benchmark's real data is published: its files or splits in a dataset repo, at a revision.
SOURCES: dict[str, list[Ref]] = {
    "clbench": [Ref("tencent/CL-bench", CLBENCH_REVISION, "CL-bench.jsonl")],
    # no commit of it known offline: `main` is asked once, the lock pins its commit (docs/benchmarks.md#coinflip)
    "coin_flip": [Ref("extraordinarylab/coin-flip", "main", split) for split in ("test", "validation")],
}
# Benchmarks whose real data is elsewhere: what to do instead.
ELSEWHERE = {
    "error_recovery": "BIG-Bench Mistake is not on the Hub: download its five task files (dyck_languages.jsonl, "
    "logical_deduction.jsonl, multistep_arithmetic.jsonl, tracking_shuffled_objects.jsonl, word_sorting.jsonl) "
    "from the GitHub repository WHGTyen/BIG-Bench-Mistake into a folder and run "
    "`make error-recovery-data BBM_DIR=<folder>`",
}

# Split names as the Hub's dataset viewer reads them from file names (the `datasets` conventions).
_SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SEPARATORS = re.compile(r"[-._ 0-9/]+")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_NAME = re.compile(r"(?!\.\.?$)[A-Za-z0-9][A-Za-z0-9_.-]*")


class HubUnreachable(StageError):
    """The Hub did not answer (no network, DNS, a dead mirror) and the file is not here yet."""

    exit_code = EXIT_UNREACHABLE


def parse_ref(text: str) -> Ref:
    """The Ref of `hf://owner/name[@revision]/file-or-split` (a revision with `/` is written %2F; none: the
    benchmark's pinned one, else `main`)."""
    body = text[len(SCHEME) :] if text.startswith(SCHEME) else text
    parts = body.split("/", 2)
    if len(parts) < 3 or not all(parts):
        raise BadInput(f"{text}: expected hf://<owner>/<name>[@<revision>]/<file or split>")
    owner, name, target = parts
    name, _, revision = name.partition("@")
    if not all(_NAME.fullmatch(part) for part in (owner, name)) or ".." in target.split("/"):
        raise BadInput(f"{text}: not a dataset repo and file of the Hub (owner/name, letters, digits, -_.)")
    repo = f"{owner}/{name}"
    pinned = next((r.revision for refs in SOURCES.values() for r in refs if r.repo == repo), "main")
    return Ref(repo, urllib.parse.unquote(revision) if revision else pinned, target.strip("/"))


def root() -> Path:
    """Where fetched files go: $EVALPIPE_HUB_DIR, else data/hf/ in the project (git-ignored)."""
    return Path(os.environ.get("EVALPIPE_HUB_DIR") or PROJECT / "data" / "hf")


def resolve_argv(argv: list[str]) -> list[str]:
    """argv with every `hf://...` word (or `--flag=hf://...`) replaced by the local file it names, fetched first."""
    out = []
    for word in argv:
        flag, eq, value = word.partition("=") if word.startswith("--") else ("", "", word)
        if value.startswith(SCHEME):
            local = str(fetch(parse_ref(value)))
            word = f"{flag}={local}" if eq else local
        out.append(word)
    return out


def source_of(path: Path) -> str | None:
    """hf://<repo>@<commit>/<file> when `path` is a fetched file whose bytes match its lock, else None."""
    try:
        parts = path.resolve().relative_to(root().resolve()).parts
    except (OSError, ValueError):
        return None
    if len(parts) < 3:  # <owner>/<name>/<file...>
        return None
    repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    entry = _read_lock(root().resolve().joinpath(*parts[:2])).get("files", {}).get(file)
    return f"{SCHEME}{repo}@{entry['commit']}/{file}" if entry and _matches(path, entry) else None


def fetch(ref: Ref) -> Path:
    """The local copy of `ref`, fetched and locked when it is not here yet (or no longer matches). A branch or
    tag is asked of the Hub each time: if it moved since the lock, the run stops and says what to choose."""
    folder = root().joinpath(*ref.repo.split("/"))
    lock = _read_lock(folder)
    files = lock.setdefault("files", {})
    by_split = (f for f, e in files.items() if e.get("split") == ref.target)
    known = ref.target if ref.target in files else next(by_split, None)  # the file, or the file of that split
    if known is not None:
        path, entry = folder / known, files[known]
        if entry.get("revision") == ref.revision and _COMMIT.fullmatch(ref.revision) and _matches(path, entry):
            return path  # a commit never moves: no need to ask
    try:
        import huggingface_hub as hub
    except ImportError:
        raise BadInput(
            "fetching from the Hugging Face Hub needs huggingface_hub: run `make data` once, or "
            ".venv/bin/pip install -r requirements-data.txt"
        ) from None
    try:
        with _answers(ref):
            info = hub.HfApi(endpoint=_endpoint()).dataset_info(ref.repo, revision=ref.revision, timeout=30)
        if not info.sha:
            raise HubUnreachable(f"{_endpoint()} did not say which commit {ref.revision} is (not a Hub endpoint?)")
    except HubUnreachable as exc:
        return _offline(ref, folder, files, known, exc)
    commit = info.sha
    if known is not None and files[known].get("revision") == ref.revision and files[known].get("commit") != commit:
        old = files[known]["commit"]
        raise BadInput(
            f"{ref.repo}@{ref.revision} moved: {folder / known} was fetched at commit {old}, the Hub now has {commit}; "
            f"to take the new data ask for --revision {commit} (hf://{ref.repo}@{commit}/{ref.target}), "
            f"to keep the old one --revision {old}"
        )
    card = info.card_data.to_dict() if info.card_data is not None else {}
    file = _file_for(ref, [s.rfilename for s in info.siblings or []], card)
    path = folder / file
    entry = files.get(file)
    split = ref.target if ref.target != file else (entry or {}).get("split")  # asked by name: keep its split
    if entry and entry.get("commit") == commit and _matches(path, entry):
        if entry.get("revision") != ref.revision or entry.get("split") != split:
            entry.update(revision=ref.revision, split=split)
            _write_lock(folder, ref.repo, lock)
        return path
    with _answers(Ref(ref.repo, commit, ref.target), file):  # its own retries resume a broken connection
        cached = Path(hub.hf_hub_download(ref.repo, file, repo_type="dataset", revision=commit, endpoint=_endpoint()))
    data = cached.read_bytes()
    size, sha256 = len(data), hashlib.sha256(data).hexdigest()
    _verify(cached, data, sha256, file)
    jsonl.atomic_write(path, data)  # a temp file beside it, then a rename: never half-written in data/
    for other in [k for k, v in files.items() if k != file and split and v.get("split") == split]:
        files[other]["split"] = None  # the split now lives in another file
    files[file] = dict(revision=ref.revision, commit=commit, split=split, size=size, sha256=sha256)
    files[file]["fetched_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    _write_lock(folder, ref.repo, lock)
    print(f"hub: {ref.repo}@{commit[:12]} {file} → {path} ({size:,} bytes, sha256 {sha256[:16]}…)", file=sys.stderr)
    return path


def _matches(path: Path, entry: dict) -> bool:
    try:
        return path.stat().st_size == entry.get("size") and manifest.sha256_file(path) == entry.get("sha256")
    except OSError:
        return False


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _quoted(revision: str) -> str:
    return urllib.parse.quote(revision, safe="")


@contextmanager
def _answers(ref: Ref, file: str | None = None) -> Iterator[None]:
    """The Hub's errors as one line: BadInput for what is not there, HubUnreachable for the rest."""
    from huggingface_hub import errors

    try:
        yield
    except errors.RevisionNotFoundError:
        raise BadInput(f"{ref.repo} has no revision {ref.revision!r} on the Hub ({_endpoint()})") from None
    except errors.GatedRepoError:
        raise BadInput(
            f"{ref.repo} is gated: accept its terms at {_endpoint()}/datasets/{ref.repo} and log in "
            "(`hf auth login`, or HF_TOKEN); the token is never written anywhere by evalpipe"
        ) from None
    except errors.RepositoryNotFoundError:
        raise BadInput(
            f"no dataset {ref.repo} on the Hub ({_endpoint()}), or it is private or gated: check the name, "
            "and log in (`hf auth login`, or HF_TOKEN) if it needs an account"
        ) from None
    except errors.RemoteEntryNotFoundError:
        raise BadInput(f"{ref.repo}@{ref.revision[:12]} lists {file} but the Hub has no such file (HTTP 404)") from None
    except errors.HFValidationError as exc:
        raise BadInput(f"{ref}: {exc}") from None
    except errors.LocalEntryNotFoundError as exc:  # huggingface_hub's word for "could not reach the Hub"
        raise HubUnreachable(f"{exc.__cause__ or exc}".splitlines()[0]) from None
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubUnreachable(f"the Hub answered HTTP {status}" + (f" while sending {file}" if file else "")) from None
    except Exception as exc:  # connection refused, DNS, TLS, timeouts: OSErrors, or its transport's (httpx) own
        if not isinstance(exc, OSError) and not type(exc).__module__.startswith(("httpx", "httpcore")):
            raise
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise HubUnreachable(f"the download of {file} broke off ({why})" if file else why) from None


def _file_for(ref: Ref, listing: list[str], card: dict) -> str:
    """The repo file `ref.target` names: a file, or the one file of a split."""
    unsafe = [f for f in listing if f.startswith("/") or ".." in f.split("/")]
    if unsafe:
        raise BadInput(f"{ref.repo}@{ref.revision}: the Hub listed a file outside the repo ({unsafe[0]!r})")
    if ref.target in listing:
        return ref.target
    found = split_files(ref.target, listing, card)
    if len(found) == 1:
        return found[0]
    shown = ", ".join(f for f in listing if not f.startswith(".")) or "none"
    if not found:
        raise BadInput(f"{ref.repo}@{ref.revision} has no file or split {ref.target!r} (its files: {shown})")
    raise BadInput(
        f"the {ref.target} split of {ref.repo}@{ref.revision} is {len(found)} files ({', '.join(found)}): "
        f"name one, e.g. hf://{ref.repo}@{ref.revision}/{found[0]}"
    )


def split_files(split: str, listing: list[str], card: dict | None = None) -> list[str]:
    """The data files of `split`: as the dataset card's `configs` declare them, else by the Hub's file names."""
    data = [f for f in listing if f.endswith((".jsonl", ".json", ".parquet"))]  # what the benchmarks' loaders read
    for config in (card or {}).get("configs") or []:
        if config.get("config_name", "default") != "default":
            continue
        files = config.get("data_files")
        entries = files if isinstance(files, list) else [{"split": "train", "path": files}]
        for item in entries:
            if isinstance(item, dict) and item.get("split") == split:
                patterns = item.get("path")
                patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
                return sorted(f for f in data if any(fnmatch(f, p) for p in patterns))
    words = _SPLIT_WORDS.get(split, (split,))
    exact = [f for f in data if split in _SEPARATORS.split(f)]
    return sorted(exact or [f for f in data if set(words) & set(_SEPARATORS.split(f))])


def _verify(cached: Path, data: bytes, sha256: str, file: str) -> None:
    """The bytes against the Hub's own id of them (huggingface_hub checks only the size): the blob is named by
    its ETag, the sha256 of an LFS file or the git blob id of a small one."""
    from huggingface_hub.utils.sha import git_hash

    name = Path(os.path.realpath(cached)).name
    if re.fullmatch(r"[0-9a-f]{64}", name):
        actual, what = sha256, "sha256"
    elif re.fullmatch(r"[0-9a-f]{40}", name):
        actual, what = git_hash(data), "git blob id"
    else:
        return  # a copy without its blob name (no symlinks): huggingface_hub checked the size
    if actual != name:
        os.unlink(os.path.realpath(cached))  # a corrupt blob must not be served from the cache again
        raise HubUnreachable(f"{file} arrived corrupted ({what} {actual[:12]}…, the Hub says {name[:12]}…)")


def _offline(ref: Ref, folder: Path, files: dict, known: str | None, why: HubUnreachable) -> Path:
    """No answer from the Hub: a locked file that still matches is used (a moved branch cannot be seen); else a
    file placed by hand where it belongs; else one line saying what to download and where to put it."""
    placed, changed, how = [], "", ""
    if known is not None and _matches(folder / known, files[known]):
        placed = [folder / known]
        how = f", locked at commit {files[known]['commit'][:12]} (whether {ref.revision} moved since cannot be checked)"
    elif known is not None:  # locked, but the copy here was changed or removed: never used unchecked
        changed = f" (the copy at {folder / known} no longer matches {LOCK_NAME})"
    elif (folder / ref.target).is_file():
        placed = [folder / ref.target]
    elif folder.is_dir():
        local = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != LOCK_NAME]
        placed = [folder / f for f in split_files(ref.target, local)]
    if len(placed) == 1:
        if not how:
            sha256 = manifest.sha256_file(placed[0])
            how = f" as placed by hand (sha256 {sha256}, not checked against the Hub, not locked)"
        print(f"hub: warning: cannot reach the Hub ({why}); using {placed[0]}{how}", file=sys.stderr)
        return placed[0]
    if "." in Path(ref.target).name:
        url = f"{_endpoint()}/datasets/{ref.repo}/resolve/{_quoted(ref.revision)}/{ref.target}"
        where = f"download {url} and put it at {folder / ref.target}"
    else:
        page = f"{_endpoint()}/datasets/{ref.repo}/tree/{_quoted(ref.revision)}"
        where = (
            f"download the {ref.target} split's file from {page} and put it under {folder}/ "
            f"(keeping its name, which says {ref.target})"
        )
    raise HubUnreachable(f"cannot reach the Hugging Face Hub to fetch {ref} ({why}){changed}: {where}, then run again")


def _read_lock(folder: Path) -> dict:
    path = folder / LOCK_NAME
    try:
        lock = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        raise BadInput(f"cannot read the lock file ({exc}); delete it to fetch afresh", path) from None
    if not isinstance(lock, dict) or not isinstance(lock.get("files", {}), dict):
        raise BadInput("not a lock file of evalpipe; delete it to fetch afresh", path)
    return lock


def _write_lock(folder: Path, repo: str, lock: dict) -> None:
    body = {"repo": repo, "repo_type": "dataset", "files": dict(sorted(lock.get("files", {}).items()))}
    jsonl.write_json(folder / LOCK_NAME, body)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evalpipe.datasets.hub",
        description="Fetch benchmarks' real datasets from the Hugging Face Hub into data/hf/ (with a lock file).",
    )
    names = ", ".join([*SOURCES, *ELSEWHERE])
    parser.add_argument(
        "what", nargs="*", help=f"benchmarks ({names}; default: all) or hf://<repo>[@<rev>]/<file or split>"
    )
    parser.add_argument("--revision", help="revision (commit, branch or tag) instead of the pinned one")
    args = parser.parse_args(argv)
    refs: list[Ref] = []
    for word in args.what or [*SOURCES, *ELSEWHERE]:
        if word.startswith(SCHEME):
            refs.append(parse_ref(word))
        elif word in SOURCES:
            refs += [replace(r, revision=args.revision or r.revision) for r in SOURCES[word]]
        elif word in ELSEWHERE:
            print(f"hub: {word}: {ELSEWHERE[word]}", file=sys.stderr)
            if args.what:
                return 2
        else:
            raise BadInput(f"{word}: no published dataset to fetch (choose from {names})")
    if args.revision and len({r.repo for r in refs}) > 1:
        raise BadInput("--revision names a revision of one repo: give one benchmark with it (BENCH=...)")
    for ref in refs:
        path = fetch(ref)
        shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
        note = " (reading Parquet needs pyarrow: .venv/bin/pip install pyarrow)" if path.suffix == ".parquet" else ""
        print(f"{ref} → {shown}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(run_stage("hub", main))
