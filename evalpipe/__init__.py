"""evalpipe: a resumable JSONL pipeline for benchmarking language models."""

__version__ = "0.1.0"
