"""Every integration test starts its own real servers through these fixtures."""

pytest_plugins = ["continuum_testing.fixtures"]
