"""Makers of benchmark data files: generators and converters (`python -m evalpipe.datasets.<name>`)."""
