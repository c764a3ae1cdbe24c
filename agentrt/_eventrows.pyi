from collections.abc import Callable, Iterable
from typing import Any

from agentrt.events import Event

def events_of(rows: Iterable[Any], cls: Callable[[Iterable[Any]], Event], /
              ) -> list[Event] | None: ...
