"""Rooms a person reads: the report text, the live TUI, the Prometheus exporter."""
