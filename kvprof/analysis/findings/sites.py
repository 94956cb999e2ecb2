"""Findings on kvs sites' cache lines (the kvs atomic probe): transfers a second,
cross-socket ones weighted, written by two or more threads or by one."""

from __future__ import annotations

from kvprof.analysis.findings.common import Context, explain, severity_of
from kvprof.analysis.hotspots import match_function, match_site
from kvprof.analysis.tables import Site, sites
from kvprof.model.profile import Finding


def _per_socket(c: Context, st: Site) -> dict[str, dict[str, float]]:
    """Transfers a second out of and into each socket."""
    per_socket: dict[str, dict[str, float]] = {}
    for i, rowm in enumerate(st.socket_matrix):
        for j, v in enumerate(rowm):
            if not v:
                continue
            for sock, key in ((str(i), "transfers_out_per_s"), (str(j), "transfers_in_per_s")):
                ps = per_socket.setdefault(sock, {"transfers_out_per_s": 0.0, "transfers_in_per_s": 0.0})
                ps[key] += v / c.dur
    return per_socket


def _site_words(st: Site, shared: bool) -> tuple[str, dict[str, str]]:
    """The finding's title, and its explanation, advice and hotspot."""
    site, rate = st.site, st.rate
    hot = match_site(site) or match_function(site)
    note = (
        f" (kvs:atomic__sample fires for 1 update in {rate}; updates and transfers are scaled by {rate}.)"
        if rate > 1
        else ""
    )
    if shared:
        return f"cache line bouncing at {site}", explain(
            hot,
            f"The counter updated at {site} sits on a cache line that several threads write. "
            "Each write by a different core moves the line there first, and the writer stalls "
            "for that round trip; across sockets it takes several times longer.",
            "Give each thread its own copy (padded to a cache line) and sum the copies on "
            "read, or batch updates locally and publish them periodically.",
            note,
        )
    words = explain(
        None,
        f"Every cache line sampled at {site} is written by one thread only, so it does "
        "not bounce between threads; the transfers counted are that thread moving to "
        "another CPU. This is the fixed design working.",
        "Nothing to do here; pinning threads to CPUs would remove the remaining moves.",
        note,
    )
    words["hotspot"] = hot.id if hot else ""
    return f"per-thread counter at {site} (not shared)", words


def site_findings(c: Context) -> list[Finding]:
    """One finding per kvs site whose lines moved often enough to count."""
    out: list[Finding] = []
    t = c.t
    for st in sites(c.p):
        site, rate = st.site, st.rate
        transfers, cross, cycles_mean = st.transfers, st.cross_socket, st.cycles_mean
        # A line written by one thread only is per-thread data: its "transfers" are that
        # thread moving between CPUs, not sharing. Unknown writers count as shared.
        shared = st.writers != 1
        per_thread = {
            tid: {
                "updates_per_s": lt.updates / c.dur,
                "transfers_per_s": lt.transfers / c.dur,
                "cycles_mean": lt.cycles_mean,
            }
            for tid, lt in st.by_thread.items()
        }
        transfers_per_s = transfers / c.dur
        cross_per_s = cross / c.dur
        weighted = transfers_per_s - cross_per_s + t.cross_socket_weight * cross_per_s
        est = weighted * t.transfer_ns * 1e-9
        if weighted < t.line_info_per_s:
            continue
        severity = severity_of(weighted, t.line_critical_per_s, t.line_warning_per_s) if shared else "info"
        title, words = _site_words(st, shared)
        out.append(
            c.finding(
                per_thread,
                "cacheline",
                site,
                title=title,
                severity=severity,
                cost={
                    "updates_per_s": st.updates / c.dur,
                    "transfers_per_s": transfers_per_s,
                    "cross_socket_per_s": cross_per_s,
                    "cross_socket_share": cross / transfers if transfers else 0.0,
                    "transfer_share": transfers / st.updates,
                    "cycles_mean": cycles_mean,
                    "cycles_max": float(st.cycles_max),
                    "lines": float(len(st.lines)),
                    "writers": float(st.writers),
                    "sample_rate": float(rate),
                    "est_s_per_s": est,
                },
                per_socket=_per_socket(c, st),
                sites=[site],
                **words,
            )
        )
    return out
