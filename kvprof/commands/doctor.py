"""`kvprof doctor [-p PID] [--json]`: can this machine profile, and what fixes it."""

from __future__ import annotations

import argparse
import textwrap

from kvprof.commands import add_pid, command, fail

HELP = "check kernel, BPF, headers, tracefs, PMU, unwind information; say what to do"

DESCRIPTION = """\
Check whether this machine can profile, and print the command that fixes each problem."""

EXAMPLES = """\
examples:
  kvprof doctor              # this machine, and the unwind information of server/build/kvcached and libc
  kvprof doctor -p 1234      # ... and of every module PID 1234 maps
  kvprof doctor --json       # the same checks as one JSON object

Each line is `ok|info|warn|FAIL  check: finding`; a problem is followed by the
command that fixes it. info: absent, and not needed. The exit status is 1 only
when profiling cannot work at all (a FAIL), else 0.
"""

WIDTH = 80


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command(commands, "doctor", HELP, DESCRIPTION, EXAMPLES)
    add_pid(p, "check the unwind information of this process's modules", required=False)
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(run=run)


def format_check(status: str, name: str, finding: str, fix: str | None) -> str:
    lines = textwrap.wrap(
        f"{name}: {finding}",
        WIDTH,
        initial_indent=f"{status:<6}",
        subsequent_indent=" " * 6,
        break_on_hyphens=False,
        break_long_words=False,
    )
    if fix:
        lines.append(f"{'':6}fix: {fix}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from kvprof.collect import CollectError
    from kvprof.system import doctor
    from kvprof.system.attach import target

    if args.pid is not None:
        try:  # a process kvprof cannot read is said as every command says it
            target(args.pid)
        except CollectError as e:
            return fail("doctor", str(e))
    checks = doctor.run_checks(args.pid)
    if args.json:
        print(doctor.to_json(checks))
    else:
        for c in checks:
            print(format_check(c.status, c.name, c.finding, c.fix))
        fatal = [c.name for c in checks if c.fatal]
        if fatal:
            print(f"\nprofiling cannot work here: fix {', '.join(fatal)} first")
        else:
            warned = sum(c.status == "warn" for c in checks)
            plural = "s" if warned > 1 else ""
            print(f"\nready to profile ({warned} warning{plural})" if warned else "\nready to profile")
    return doctor.exit_status(checks)
