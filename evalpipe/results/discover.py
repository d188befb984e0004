"""Where results are: the results roots at or below an outputs folder (make report, the viewer).

A results root is the outputs folder itself or any folder below it, up to MAX_DEPTH levels down
(e.g. outputs/demo/ of `make demo`), that holds <bench>/<model>/run-<K>/ for a registered
benchmark; what a run folder must hold to count is the caller's `benches_in`.
"""

from collections.abc import Callable
from pathlib import Path

MAX_DEPTH = 3  # outputs/a/b/c is the deepest root looked at


def subfolders(folder: Path) -> list[Path]:
    """Folders that may hold results roots or models: no symlinks, hidden folders or run folders, sorted."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [p for p in entries if p.is_dir() and not p.is_symlink() and not p.name.startswith((".", "run-"))]


def find_roots(outputs_dir: Path, benches_in: Callable[[Path], list[str]]) -> list[tuple[Path, list[str]]]:
    """(root, its benchmarks) for every results root at or below outputs_dir: the top first, then by path."""
    found, pending = [], [(outputs_dir, 0)]
    while pending:
        folder, depth = pending.pop()
        present = benches_in(folder)
        if present:
            found.append((folder, present))
        if depth < MAX_DEPTH:
            # a root's benchmark folders hold model folders, not further roots
            pending += [(sub, depth + 1) for sub in subfolders(folder) if sub.name not in present]
    return sorted(found, key=lambda item: item[0].relative_to(outputs_dir).parts)
