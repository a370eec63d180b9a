"""What reading a team's existing configs shares: a launch script read as bash would expand it
(:mod:`planner.readers.bash`). Each engine's reader is its package's: planner/engines/<name>/read.py."""
