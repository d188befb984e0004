"""Where results are (make report, the viewer, publish): the results roots at or below an outputs folder that hold
<bench>/<model>/run-<K>/ folders holding what the caller asks."""

from collections.abc import Callable, Iterable
from pathlib import Path

from ..store import paths

MAX_DEPTH = 3  # outputs/a/b/c is the deepest root looked at


def subfolders(folder: Path) -> list[Path]:
    """Folders that may hold results roots or models: no symlinks, hidden folders or run folders, sorted."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [p for p in entries if p.is_dir() and not p.is_symlink() and not p.name.startswith((".", "run-"))]


def runs(bench_dir: Path, holds: Callable[[Path], bool]) -> list[tuple[str, int, Path]]:
    """(model folder, run number, run folder) of every run folder under bench_dir that `holds`, by model then run."""
    found = []
    for model_dir in subfolders(bench_dir):
        for run_dir in model_dir.glob("run-*"):
            if (m := paths.RUN_DIR.match(run_dir.name)) and run_dir.is_dir() and holds(run_dir):
                found.append((model_dir.name, int(m.group(1)), run_dir))
    return sorted(found)


def find_roots(outputs_dir: Path, names: Iterable[str], holds: Callable[[Path], bool]) -> list[tuple[Path, list[str]]]:
    """(root, its benchmarks of `names`) for every results root at or below outputs_dir: the top first, then by path."""
    names = list(names)
    found, pending = [], [(outputs_dir, 0)]
    while pending:
        folder, depth = pending.pop()
        present = [name for name in names if runs(folder / name, holds)]
        if present:
            found.append((folder, present))
        if depth < MAX_DEPTH:
            # a root's benchmark folders hold model folders, not further roots
            pending += [(sub, depth + 1) for sub in subfolders(folder) if sub.name not in present]
    return sorted(found, key=lambda item: item[0].relative_to(outputs_dir).parts)
