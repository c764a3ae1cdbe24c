"""Benchmarks: every performance bar of DESIGN.md, each against a reference in the same run.

``python -m bench`` (``make bench``) runs every ``bench/bench_*.py`` module it
finds, prints one table and exits 1 if any bar is missed (2 if a benchmark
failed to run); ``--quick`` (``make bench-quick``) uses small sizes and
finishes in about a minute; ``--only export,otel`` runs some modules. Each
module also runs alone: ``python -m bench.bench_export [--quick]``.

The contract a benchmark module follows
---------------------------------------

- It is named ``bench/bench_<name>.py`` and has a function
  ``run(quick: bool) -> list[bench.common.Figure]``. The runner imports it and
  calls ``run``; nothing else is needed to join ``make bench``.
- ``run`` measures and returns figures; it does not print the table. Progress
  goes to stderr (``bench.common.log``). It raises if the measurement itself
  failed (a process exited non-zero, a count came out wrong): the runner
  reports the module as failed rather than as a missed bar.
- A :class:`~bench.common.Figure` holds one bar: ``what`` was measured, its
  ``unit``, the per-round ``values``, the ``reference`` and its per-round
  ``refs`` (same length when the rounds are paired, any length otherwise),
  and the :class:`~bench.common.Bar` (``Bar(">=", 1.0)`` on the ratio,
  ``Bar("<=", 10, on="value")`` on the figure itself). The ratio is the median
  of the per-round ratios (paired) or of each value over the reference's
  median; the spread is the range over up to five rounds, else the
  interquartile range. A ``note`` is printed under the row.
- The measured side and its reference run in the same invocation, alternating
  within each round (``bench.common.paired_rounds``): this host's speed drifts
  by 2x within a minute, so nothing is compared across time.
- Large inputs are made by the benchmark, never committed:
  ``bench.common.event_db(n)`` gives a database of ``n`` chained events
  (copies of runs recorded by the real driver), made once per invocation and
  shared by the modules that ask for the same size. Scratch files live under
  ``bench/out/`` (ignored by git) and are removed at exit.
- Child processes run this checkout's code: pass ``env=child_env()``.
  ``run_measured(cmd)`` gives a command's wall time, CPU time and its own peak
  RSS.
- ``if __name__ == "__main__": sys.exit(bench.common.main(run))`` gives the
  module its own command line.
"""
