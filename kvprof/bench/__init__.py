"""`kvprof bench`: prove a fix with statistics.

Every variant's server runs side by side; kvload runs against them
interleaved (A B C, A B C, ...) so machine drift hits all alike. Results are
pyperf JSON; the table shows medians, CVs, ratios to each group's first
variant, a t-test and a verdict in the style of the Redis CE performance
automation.

Modules, one concern each: `stats` (pure statistics and the verdict),
`variants` (what is measured), `scenarios` (the named experiments),
`loadgen` (kvload's and memcaslap's command lines and output), `machine`
(CPU accounting, waiting for an idle machine), `runner` (servers and the
interleaved rounds), `results` (pyperf JSON), `atomics` (the counter
experiment), `table` (80-column rendering) and `command` (what the CLI calls).
"""


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says why."""
