"""Studies: scenarios, every variant of one per seed, and the report."""
