"""What a person reads: the report text and the metrics the exporter serves (the live view is kvprof.tui)."""
