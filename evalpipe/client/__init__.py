"""Talking to an endpoint: chat calls and their deadlines (llm), how many run at once (limiter, scheduler),
the judge's output format, batch APIs, the run loop (runner), and what calls cost and the cap on it."""
