"""One module per `kvprof` command, each with:

    def add_parser(commands: argparse._SubParsersAction) -> None
        # adds the subcommand, with an `examples:` epilog, and
        # set_defaults(run=<function taking the Namespace, returning the exit status>)

Modules here import only the standard library and kvprof.model at import
time; anything heavy (bcc, textual, pyperf) is imported inside the run
function, so `kvprof --help` and the commands that do not need BPF or the TUI
never load them (tests/test_cli.py checks it).
"""
