"""error analysis (`judge.py --error-analysis`, CL-bench): classify why each failed solution failed.

The judge rows are the input and `<error_analysis_name>.jsonl` beside them the output; the judge
model does the classifying, with judge.py's flags and endpoint. Resumable like every stage: a
failed solution is pending until it has an analysis row its benchmark leaves as it is.
"""

from ..benchmarks import Benchmark
from ..benchmarks.base import ErrorAnalysis
from ..errors import BadInput
from ..store import paths, shards
from . import graded


def main(bench: Benchmark, args) -> int:
    """Entered from judge.main with the parsed flags: let the engine classify every failed solution not yet analyzed."""
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
