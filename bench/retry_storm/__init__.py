"""bench.retry_storm: see __main__.py (python -m bench.retry_storm --help)."""
