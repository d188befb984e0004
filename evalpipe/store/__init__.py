"""Where rows live: JSONL files written atomically, checkpoints, locks, manifests, the results folder's paths,
shards, and the shapes of rows."""
