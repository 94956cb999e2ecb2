"""`python -m kvprof` is the `kvprof` command."""

from kvprof.cli import main

raise SystemExit(main())
