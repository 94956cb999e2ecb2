"""How long a big profile takes to become an SVG flame graph, and how big the file is.

    .venv/bin/python bench/flamegraph_speed.py [--samples 1000000] [--stacks 100000] [--repeat 3]

Makes a synthetic on-CPU profile (seeded, so every run draws the same one):
`--stacks` distinct stacks, 4 to 40 frames deep, walked through a call graph
of 3,000 functions (a few hundred kernel ones) where each function calls
from 2 to 8 others, and `--samples` samples spread over them with a
Zipf-like skew (a few hot stacks, a long tail), 4 threads. Then it times
`kvprof.export.write(profile, "cpu", "x.svg")`, everything from the profile
to the file on disk, `--repeat` times, and prints each time, the median,
the file size and how many frames were drawn and pruned. Targets: under
3 s and under 10 MB (docs/flamegraph.md states what this machine measured).
The machines are noisy: read the median, and run it again when in doubt.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvprof.bench import published  # noqa: E402
from kvprof.export import Options, write  # noqa: E402
from kvprof.model.profile import CpuStack, Profile, Target, ThreadInfo, Window  # noqa: E402


def synthetic(samples: int, stacks: int, seed: int = 1) -> Profile:
    rng = random.Random(seed)
    user = [f"kv_fn_{i:04d}" for i in range(2700)] + ["update_topkeys", "collect_timings", "on_create_item"]
    kernel = [f"ksym_{i:03d}_[k]" for i in range(300)]
    callees = {f: rng.sample(user, rng.randint(2, 8)) for f in user}
    kcallees = {f: rng.sample(kernel, rng.randint(2, 4)) for f in kernel}
    seen: set[tuple[str, ...]] = set()
    while len(seen) < stacks:
        frames = ["start_thread", "worker_main"]
        depth = rng.randint(4, 40)
        fn = rng.choice(user[:40])
        while len(frames) < depth:
            frames.append(fn)
            if fn.endswith("_[k]"):
                fn = rng.choice(kcallees[fn])
            elif rng.random() < 0.04:
                fn = rng.choice(kernel[:30])  # a system call
            else:
                fn = rng.choice(callees[fn])
        seen.add(tuple(frames))
    ordered = sorted(seen)
    rng.shuffle(ordered)
    # Zipf-like weights (rank^-0.9), every stack at least 1 sample, exact total
    raw = [1 / (r + 1) ** 0.9 for r in range(stacks)]
    spare = samples - stacks
    scale = spare / sum(raw)
    counts = [1 + int(w * scale) for w in raw]
    counts[0] += samples - sum(counts)
    tids = [1001, 1002, 1003, 1004]
    oncpu = [CpuStack(tids[i % 4], list(f), c) for i, (f, c) in enumerate(zip(ordered, counts, strict=True))]
    threads = {str(t): ThreadInfo(name=f"kv-worker-{i}", cpu_samples=0) for i, t in enumerate(tids)}
    return Profile(
        target=Target(pid=1000, comm="kvcached"),
        window=Window(start=time.time(), duration_s=60.0),
        hz=999,
        collectors=["oncpu"],
        threads=threads,
        oncpu=oncpu,
    )


def announced(samples: int, stacks: int) -> Profile:
    """synthetic(), and a line that says what it made."""
    t0 = time.perf_counter()
    profile = synthetic(samples, stacks)
    print(
        f"synthetic profile: {sum(s.count for s in profile.oncpu):,} samples, "
        f"{len(profile.oncpu):,} distinct stacks (made in {time.perf_counter() - t0:.1f} s)"
    )
    return profile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--stacks", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--min-width", type=float, default=None, help="px (default: the exporter's)")
    ap.add_argument("--keep", type=Path, help="also write the SVG here")
    args = ap.parse_args()

    profile = announced(args.samples, args.stacks)
    opts = Options() if args.min_width is None else Options(min_width=args.min_width)
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "flame.svg"
        for i in range(args.repeat):
            t = time.perf_counter()
            written = write(profile, "cpu", out, opts)
            times.append(time.perf_counter() - t)
            print(f"  repeat {i + 1}: {times[-1]:.2f} s")
        size = out.stat().st_size
        if args.keep:
            args.keep.write_bytes(out.read_bytes())
    median = statistics.median(times)
    print(f"SVG: median {median:.2f} s over {len(times)} runs, {size / 1e6:.2f} MB")
    print(
        f"  {written.frames:,} frames drawn, {written.pruned:,} pruned (narrower than {opts.min_width:g} px)"
    )
    print(
        f"  target: < 3 s {'met' if median < 3 else 'NOT met'}, < 10 MB {'met' if size < 10e6 else 'NOT met'}"
    )
    figures = [
        published.Figure.median_of("SVG written", times, "s", "repeats"),
        published.Figure("SVG size", round(size / 1e6, 2), "MB"),
    ]
    settings = {
        "samples": args.samples,
        "stacks": args.stacks,
        "repeat": args.repeat,
        "min_width": opts.min_width,
    }
    doc = published.document(
        "flamegraph-speed", "A synthetic profile to an SVG flame graph", figures, settings
    )
    where = published.write(doc, REPO / "bench" / "results")
    print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
