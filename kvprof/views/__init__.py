"""What a person reads: the report text and the Prometheus exporter (the live view is kvprof.tui)."""
