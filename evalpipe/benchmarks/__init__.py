"""The benchmark registry: stages look a benchmark up here, never branch on its name (docs/adding-a-benchmark.md)."""

from collections.abc import Callable, Sequence
from functools import partial

from ..results.items import ItemFigure
from ..results.shapes import CLBenchShape, CoinFlipShape, ErrorRecoveryShape, Shape
from ..store.rows import row_id
from .arithmetic import Arithmetic
from .base import Benchmark, ErrorAnalysis, Task, flag
from .clbench import CLBench
from .coin_flip import ZERO_SHOT, CoinFlip
from .error_recovery import ErrorRecovery

REGISTRY: dict[str, type[Benchmark]] = {
    CLBench.name: CLBench,
    CoinFlip.name: CoinFlip,
    ErrorRecovery.name: ErrorRecovery,
    Arithmetic.name: Arithmetic,
}
DEFAULT = CLBench.name  # what the stages run without --bench (the product's first benchmark)
# how report.html shows a benchmark's samples (results/shapes.py); the generic Shape for one not named here
VIEWS: dict[str, Callable[[Sequence[ItemFigure]], Shape]] = {
    CLBench.name: CLBenchShape,
    CoinFlip.name: partial(CoinFlipShape, template=ZERO_SHOT),
    ErrorRecovery.name: ErrorRecoveryShape,
}


def get(name: str) -> Benchmark:
    """The named benchmark with its default options."""
    return REGISTRY[name]()


def sample_views() -> dict[str, Shape]:
    """Each benchmark's shape in report.html, by name: what the viewer is handed."""
    return {name: VIEWS.get(name, Shape)(bench.figures) for name, bench in REGISTRY.items()}


__all__ = ["DEFAULT", "Benchmark", "ErrorAnalysis", "Task", "REGISTRY", "flag", "get", "row_id", "sample_views"]
