"""The grace a stop gives output, or a collector, that takes nothing more.

Both graces are 5 s: the record in hand on a full output
(``agentrt.trace._FINISH_RECORD_S``) and an export attempt to a collector
that does not answer (``agentrt_otel.transport.STOP_GRACE``). The private
``AGENTRT_STOP_GRACE_S`` only exists so that the tests of a grace running out
need not sit it out; it can shorten the graces, never lengthen them. Each
case is a fresh interpreter, since the variable is read at import.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from eventdb import REPO_ROOT, child_env

GRACES = ("from agentrt.trace import _FINISH_RECORD_S as a; "
          "from agentrt_otel.transport import STOP_GRACE as b; print(a, b)")


def graces(value: str | None) -> str:
    env = {k: v for k, v in child_env().items() if k != "AGENTRT_STOP_GRACE_S"}
    if value is not None:
        env["AGENTRT_STOP_GRACE_S"] = value
    done = subprocess.run([sys.executable, "-c", GRACES], capture_output=True, env=env,
                          cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().strip()


def test_a_stop_gives_output_and_a_collector_five_seconds_by_default():
    assert graces(None) == "5.0 5.0"


def test_the_private_variable_shortens_both_graces():
    assert graces("0.25") == "0.25 0.25"


@pytest.mark.parametrize("value", ["soon", "0", "nan", "60"])
def test_a_value_that_would_not_shorten_the_grace_leaves_it_at_five_seconds(value):
    assert graces(value) == "5.0 5.0"
