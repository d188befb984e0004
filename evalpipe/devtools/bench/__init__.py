"""`make bench`: the pipeline's own cost, measured against loopback servers, each figure beside its
reference (a peer, a floor or an ideal measured in the same run: a shared machine is noisy), the
ratio, and the target. One module per part; `python -m evalpipe.devtools.bench --only PART` runs one.

  throughput  infer.py against bare SDK loops at 64 and 1,000 in flight
  ratelimit   a rate-limited server: x-ratelimit-* headers (requests, tokens), Retry-After only, bare 429s
  scale       resume over 1,000,000 rows, slim rows, score.py and aggregate.py over 1,000,000 rows
  viewer      report.html of 100,000 CoinFlip samples and of a CL-bench-shaped set, in headless chromium
  errorbars   item-level figures of a CL-bench-shaped run set
  prefix      shared-prefix scheduling of a CL-bench-shaped set against a prefix-caching server
"""
