"""One job on a live fabric: agents started, a schedule run, metrics collected."""
