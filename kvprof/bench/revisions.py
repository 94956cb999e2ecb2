"""`kvprof bench --rev A --rev B`: kvcached built at git revisions, as variants.

The repository is the one the current directory is in (as for git itself).
Each revision is checked out with `git worktree add --detach` under the
repository's gitignored `build/bench-revs/`, built there with `make -C
server`, and the worktree is removed again; the binary stays, named by its
commit, so a second bench of the same commit does not build again. The
user's checkout, index and branch are never touched.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from kvprof.bench import BenchError
from kvprof.bench.variants import ClientConfig, Group, Plan, Variant, parse_server

BUILD_DIR = Path("build") / "bench-revs"  # under the repository; /build/ is in .gitignore
DEFAULT_SPEC = "fixed"
GIT_TIMEOUT_S = 120
BUILD_TIMEOUT_S = 600


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S
    )


def repository(cwd: Path | None = None) -> Path:
    """The top of the git work tree the current directory is in."""
    if shutil.which("git") is None:
        raise BenchError("--rev needs git (Debian package git)")
    proc = _git(cwd or Path.cwd(), "rev-parse", "--show-toplevel")
    if proc.returncode != 0:
        raise BenchError(f"--rev: {cwd or Path.cwd()} is not in a git repository")
    return Path(proc.stdout.strip())


def resolve(repo: Path, rev: str) -> str:
    """The commit id `rev` names; BenchError when it names none."""
    if not rev or rev.startswith("-"):
        raise BenchError(f"--rev: {rev!r} is not a revision")
    proc = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if proc.returncode != 0:
        raise BenchError(f"--rev: unknown revision {rev!r} in {repo}")
    return proc.stdout.strip()


def _first_error(output: str) -> str:
    """The line of a failed build that says why, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() and not line.startswith("make"):
            return line
    return lines[-1] if lines else "no output"


def build(repo: Path, rev: str, commit: str, progress: TextIO) -> Path:
    """kvcached built at `commit`, cached as build/bench-revs/<commit>/kvcached."""
    root = repo / BUILD_DIR
    binary = root / commit / "kvcached"
    if binary.is_file():
        print(f"kvcached at {rev} ({commit[:12]}): {binary} (built before)", file=progress, flush=True)
        return binary
    src = root / f"{commit}-src"
    if src.exists():  # left by an interrupted build
        _git(repo, "worktree", "remove", "--force", str(src))
        shutil.rmtree(src, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    added = _git(repo, "worktree", "add", "--detach", "--force", str(src), commit)
    if added.returncode != 0:
        raise BenchError(f"--rev {rev}: git worktree add failed: {_first_error(added.stderr)}")
    try:
        print(f"building kvcached at {rev} ({commit[:12]}) in {src}", file=progress, flush=True)
        try:
            made = subprocess.run(
                ["make", "-C", str(src / "server")], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise BenchError(
                f"kvcached at {rev} ({commit[:12]}) did not build in {BUILD_TIMEOUT_S} s"
            ) from None
        built = src / "server" / "build" / "kvcached"
        if made.returncode != 0 or not built.is_file():
            why = _first_error(made.stderr + made.stdout) if made.returncode else "no server/build/kvcached"
            raise BenchError(f"kvcached does not build at {rev} ({commit[:12]}): {why}")
        binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, binary)
    finally:
        _git(repo, "worktree", "remove", "--force", str(src))
        shutil.rmtree(src, ignore_errors=True)
        _git(repo, "worktree", "prune")
    return binary


def plan(
    revs: Sequence[str],
    spec: str,
    workers: Sequence[int],
    client_of: Callable[[int], ClientConfig],
    progress: TextIO,
) -> Plan:
    """One group per worker count: the same server spec built at each revision, in the given order."""
    if len(set(revs)) != len(revs):
        raise BenchError("--rev: the same revision twice")
    repo = repository()
    commits = [resolve(repo, rev) for rev in revs]  # every name checked before anything is built
    binaries = [build(repo, rev, commit, progress) for rev, commit in zip(revs, commits, strict=True)]
    groups = []
    for w in workers:
        base = parse_server(spec, w)
        client = client_of(w)
        title = f"{base.label}, {w} worker{'s' if w != 1 else ''}, kvload {client.label}"
        variants = tuple(
            Variant(
                f"{rev} t={w}",
                title,
                replace(base, binary=str(binary), revision=rev, commit=commit),
                client,
            )
            for rev, commit, binary in zip(revs, commits, binaries, strict=True)
        )
        groups.append(Group(title, variants))
    return Plan("rev", tuple(groups))
