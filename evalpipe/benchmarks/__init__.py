"""The benchmark registry: stages look a benchmark up here and never branch on its name."""

from .base import Benchmark, Task, row_id
from .clbench import CLBench
from .coin_flip import CoinFlip
from .error_recovery import ErrorRecovery

REGISTRY: dict[str, type[Benchmark]] = {
    CLBench.name: CLBench,
    CoinFlip.name: CoinFlip,
    ErrorRecovery.name: ErrorRecovery,
}


def get(name: str) -> Benchmark:
    return REGISTRY[name]()


__all__ = ["Benchmark", "Task", "REGISTRY", "get", "row_id"]
