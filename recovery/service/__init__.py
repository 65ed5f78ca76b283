"""The coordinator's HTTP service and its SQLite journal (composition root; being built)."""
