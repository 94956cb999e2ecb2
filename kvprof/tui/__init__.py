"""`kvprof top`: the live terminal UI.

The only package that imports textual, and only in app.py and widgets.py:
`data` turns cumulative Profile snapshots into the plain rows each view
shows (testable without textual), `sources` gives those snapshots (a live
BPF session, or the replay of a recorded profile), `app` renders them.
"""
