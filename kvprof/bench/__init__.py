"""`kvprof bench`: prove a fix with statistics.

Every variant's server runs side by side; kvload runs against them
interleaved (A B C, A B C, ...) so machine drift hits all alike. Results are
pyperf JSON; the table shows medians, CVs, per-round ratios to each group's
first variant, a paired t-test and a verdict judged on those ratios.

Modules, one concern each: `stats` (pure statistics and the verdict),
`variants` (what is measured), `scenarios` (the named experiments),
`loadgen` (kvload's and memcaslap's command lines and output), `machine`
(CPU accounting, waiting for an idle machine), `runner` (servers and the
interleaved rounds), `instructions` (the same variants under cachegrind),
`revisions` (kvcached built at git revisions), `history` (the `--history`
file and its waterline), `results` (pyperf JSON), `atomics` (the counter
experiment), `table` (80-column rendering) and `command` (what the CLI calls).
"""


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


class BadOptions(ValueError):
    """What was asked cannot be run (options that do not go together, a result file
    that cannot be read): bad input, said before anything runs; the message says why."""
