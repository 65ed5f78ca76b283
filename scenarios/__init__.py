"""scenarios: fault scenarios as data and the runner that injects, observes and reports.
Not built yet."""
