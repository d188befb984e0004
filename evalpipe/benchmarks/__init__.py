"""The benchmark registry: stages look a benchmark up here and never branch on its name.

Adding a benchmark is one module in this folder and one line below (docs/adding-a-benchmark.md).
"""

from .arithmetic import Arithmetic
from .base import Benchmark, ErrorAnalysis, Task, flag, row_id
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


__all__ = ["DEFAULT", "Benchmark", "ErrorAnalysis", "Task", "REGISTRY", "flag", "get", "row_id"]
