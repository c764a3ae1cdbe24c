from collections.abc import Callable, Sequence

from agentrt.events import Event

def join_records(events: Sequence[Event], types: tuple[type, ...],
                 fallback: Callable[[Event], bytes], /) -> bytes: ...
