"""Can BCC compile, load and attach a program here? Run as a subprocess by
`kvprof doctor` (`python -m kvprof.collect.selftest`), so a BCC that crashes
or hangs on a broken header tree cannot take the doctor down with it.

Prints one JSON object: {"ok": true, "bcc": "0.26.0"} or {"ok": false,
"error": "<one line>"}; the exit status is 0 either way.
"""

from __future__ import annotations

import json
import sys

# A tracepoint that always exists, and no kernel struct: only its format fields.
PROGRAM = b"""
TRACEPOINT_PROBE(sched, sched_process_exit) {
    return args->pid == 0;
}
"""


def run() -> dict[str, object]:
    try:
        import bcc
    except ImportError as e:
        return {"ok": False, "error": f"BCC is not importable: {e}"}
    version = str(getattr(bcc, "__version__", "?"))
    try:
        b = bcc.BPF(text=PROGRAM)
    except Exception as e:  # BCC raises plain Exception on compile/load/attach failures
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return {"ok": False, "bcc": version, "error": first}
    b.cleanup()
    return {"ok": True, "bcc": version}


if __name__ == "__main__":
    sys.stdout.write(json.dumps(run()) + "\n")
