"""Build one of agentrt's C modules with AddressSanitizer and run a child
Python that loads it (skipped only where gcc or its libasan is missing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from eventdb import REPO_ROOT

REPO = Path(REPO_ROOT)


def run_under_asan(tmp_path: Path, module: str, child: str, *args: str,
                   defines: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``child`` (Python source) with ``sys.argv[1]`` the sanitized build of
    ``agentrt/<module>.c`` and ``args`` after it. PYTHONMALLOC=malloc puts every
    Python object in ASan's heap too, so a use after free aborts the child."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc here to build the module with AddressSanitizer")
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True, check=True).stdout.strip()
    if not os.path.isabs(libasan):  # gcc answers the bare name when it has none
        pytest.skip("this gcc has no AddressSanitizer runtime (libasan)")
    built = tmp_path / (module + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fsanitize=address", *defines,
                    "-fno-omit-frame-pointer", "-I", sysconfig.get_path("include"),
                    str(REPO / "agentrt" / f"{module}.c"), "-o", str(built)], check=True)
    env = dict(os.environ, PYTHONMALLOC="malloc", LD_PRELOAD=libasan,
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=3")
    return subprocess.run([sys.executable, "-c", child, str(built), *args], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
