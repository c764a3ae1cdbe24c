"""``python -m bench [--quick] [--only NAME,...]``: every benchmark, one table, an exit code.

Exit 0 when every bar is met, 1 when one is missed, 2 when a benchmark could
not run (its error is printed and the others still run).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import platform
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime

from bench.common import REPO_ROOT, Figure, print_table


def discover() -> list[str]:
    """Names of the ``bench_*`` modules in this package, sorted."""
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([here])
                  if m.name.startswith("bench_"))


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> list[str]:
    """Where and when the figures were made."""
    import apsw

    sqlite3_cli = subprocess.run(["sqlite3", "--version"], capture_output=True,
                                 text=True).stdout.split()[:1] or ["missing"]
    dirty = " (with uncommitted changes)" if _git("status", "--porcelain", "--", ".") else ""
    load = os.getloadavg()
    return [
        f"date:    {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"commit:  {_git('rev-parse', '--short=12', 'HEAD')}{dirty}",
        f"machine: {os.cpu_count()} cores, {platform.machine()}, {platform.system()} "
        f"{platform.release()}, load average {load[0]:.2f} at start",
        f"python:  {platform.python_version()} ({platform.python_implementation()}), "
        f"SQLite {apsw.sqlite_lib_version()} (apsw {apsw.apsw_version()}), "
        f"sqlite3 CLI {sqlite3_cli[0]}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and fewer rounds (about a minute)")
    parser.add_argument("--only", default="",
                        help="comma-separated module names, e.g. export,otel")
    args = parser.parse_args(argv)
    names = discover()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"no benchmark named {', '.join(unknown)} (have: {', '.join(names)})")
        names = [n for n in names if n in wanted]
    header = machine()
    print("\n".join(header), flush=True)
    started = time.monotonic()
    figures: list[Figure] = []
    failed: list[str] = []
    for name in names:
        began = time.monotonic()
        print(f"[{name}] running", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"bench.bench_{name}")
            figures.extend(module.run(args.quick))
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"[{name}] {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    print(f"mode:    {'quick' if args.quick else 'full'}, {len(names)} benchmarks "
          f"({', '.join(names)}) in {time.monotonic() - started:.0f} s")
    print()
    print_table(figures)
    barred = [f for f in figures if f.bar is not None]  # the rest are shown, not judged
    missed = [f for f in barred if not f.ok]
    print()
    if failed:
        print(f"FAILED to run: {', '.join(failed)}")
    print(f"{len(barred) - len(missed)} of {len(barred)} bars met"
          + (f"; missed: {'; '.join(f.what for f in missed)}" if missed else ""))
    if failed:
        return 2
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
