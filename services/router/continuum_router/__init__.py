"""The `continuum-router` command (serve, up, config, bench) and the embedded composition of the
services: the one package that imports several services (docs/architecture.md)."""
