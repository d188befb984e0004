"""Tools that are not the pipeline: the loopback test server, chaos and speed runs, the local-model demo.

The product never imports these; make targets and tests run them with `python -m evalpipe.devtools.<tool>`.
"""
