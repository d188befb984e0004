"""The benchmark registry: stages look a benchmark up here and never branch on its name.

Adding a benchmark is one module in this folder and one line below (docs/adding-a-benchmark.md).
"""

from ..results.shapes import Shape
from ..store.rows import row_id
from .arithmetic import Arithmetic
from .base import Benchmark, ErrorAnalysis, Task, flag
from .clbench import CLBench
from .coin_flip import CoinFlip
from .error_recovery import ErrorRecovery

REGISTRY: dict[str, type[Benchmark]] = {
    CLBench.name: CLBench,
    CoinFlip.name: CoinFlip,
    ErrorRecovery.name: ErrorRecovery,
    Arithmetic.name: Arithmetic,
}
DEFAULT = CLBench.name  # what the stages run without --bench (the product's first benchmark)


def get(name: str) -> Benchmark:
    """The named benchmark with its default options."""
    return REGISTRY[name]()


def sample_views() -> dict[str, Shape]:
    """Each benchmark's shape in report.html, by name: what the viewer is handed."""
    return {name: bench.viewer_shape(bench.figures) for name, bench in REGISTRY.items()}


__all__ = ["DEFAULT", "Benchmark", "ErrorAnalysis", "Task", "REGISTRY", "flag", "get", "row_id", "sample_views"]
