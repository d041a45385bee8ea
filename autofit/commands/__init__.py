"""One module per CLI command; each exposes `run(overrides) -> exit code`."""
