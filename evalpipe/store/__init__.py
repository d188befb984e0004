"""Where rows live: JSONL files, checkpoints, locks, manifests, the results folder's paths, shards, row shapes."""
