"""Shared test setup: make the helper modules in tests/ importable by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
