"""The four stages behind infer.py, judge.py, score.py and aggregate.py."""
