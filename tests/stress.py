"""How many rounds a concurrency or crash test runs.

CI runs each such test a bounded number of rounds, which still fails when the
claim is false in a typical interleaving; ``make stress`` (AGENTRT_STRESS=1)
runs many, to catch the rare ones. Tests that use this are marked ``slow``.
"""

import os

STRESS = os.environ.get("AGENTRT_STRESS") == "1"


def rounds(ci: int, stress: int) -> int:
    return stress if STRESS else ci
