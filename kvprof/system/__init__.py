"""The machine around the target: doctor checks, and the server launcher used by demo, bench and tests."""
