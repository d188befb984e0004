"""error analysis (`judge.py --error-analysis`, CL-bench): classify why each failed solution failed, by the judge
model with judge.py's flags, into `<error_analysis_name>.jsonl` beside the judge rows (resumable like judge)."""

from ..benchmarks import Benchmark
from ..benchmarks.base import ErrorAnalysis
from ..errors import BadInput
from ..store import paths, shards
from . import graded


def main(bench: Benchmark, args) -> int:
    assert isinstance(bench, ErrorAnalysis)  # judge.py offers --error-analysis only then
    in_path = graded.input_path(bench, args, paths.judge_file_name(args.judge_label))
    output = args.output or paths.error_analysis_path(in_path, bench.error_analysis_name)
    if not shards.exists(in_path):
        raise BadInput("no such judge file (run judge first)", in_path)
    return graded.run(
        bench,
        args,
        in_path,
        output,
        label="error analysis",
        stage="error_analysis",
        prompts=bench.error_analysis_prompts(),
        is_done=bench.is_analyzed,
        work=bench.analyze_error,
        keep=bench.needs_error_analysis,
    )
