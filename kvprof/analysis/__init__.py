"""Analysis: the hotspot catalog and the findings drawn from a profile.

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
