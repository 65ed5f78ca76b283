"""pytest plugins shared by several test packages (registered in tests/conftest.py)."""
