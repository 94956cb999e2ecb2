"""Analysis: a window's tables (tables), the rows the views show of them (rows), the
hotspot catalog (hotspots) and the findings drawn from them (findings/).

Pure functions over kvprof.model; nothing here imports bcc or textual.
"""

from kvprof.analysis.findings import THRESHOLDS, Thresholds, find, rank_key, summary
from kvprof.analysis.hotspots import CATALOG, Hotspot, match_function, match_lock, match_site

__all__ = [
    "CATALOG",
    "THRESHOLDS",
    "Hotspot",
    "Thresholds",
    "find",
    "match_function",
    "match_lock",
    "match_site",
    "rank_key",
    "summary",
]
