"""``python bench/_launch.py OUT CMD...``: run CMD and write its own resource use to OUT.

A child's ``ru_maxrss`` counts the memory of the process it was forked from
(Linux accounts the old address space at ``exec``), so a benchmark harness
holding a few hundred MB cannot read a child's peak RSS directly. This small
process forks the command itself and writes ``seconds cpu_seconds
maxrss_kb exit_code`` for it alone. The command inherits stdin, stdout and
stderr.
"""

import os
import sys
import time


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - started
    with open(out, "w") as f:
        f.write(f"{seconds} {usage.ru_utime + usage.ru_stime} {usage.ru_maxrss} "
                f"{os.waitstatus_to_exitcode(status)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
