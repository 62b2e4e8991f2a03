"""Weeks, not minutes: a store of every run's figures over time (and a platform's own
production metrics beside them), the rolling figure, the drift of the last window against a
baseline, change points, and the gate's drift rule.

It sits between `analysis` (whose registry names and reads the figures it stores) and
`pipeline` (whose `run --history` adds a finished run): it imports `analysis`, `run` and
`workload` only. Modules: store (the DuckDB file), rundata (a run directory as an entry),
prometheus (range-query exports and scrape files as entries), trends (rolling, drift, queue
ratios), changepoints (ruptures with a stated penalty), windows (`14d`), view (what `history
show` prints), drift_rule (the gate's `drift(...)` rule).
"""
