"""What a person reads: statistics, tables, plots and the leaderboard of every benchmark."""
