"""Persistence: opening rules, migrations, the transaction helper, reads and the chain."""

from agentrt.store.chainread import ChainBreak, VerifyReport
from agentrt.store.opening import StoreOpenError
from agentrt.store.pages import PageError
from agentrt.store.store import (
    ForkedStoreError,
    ReadOnlyStoreError,
    Store,
    open_existing,
    open_store,
)
from agentrt.store.tx import (
    StoreClosedError,
    StoreFullError,
    StoreIOError,
    StoreWriteError,
    TransactionEndedError,
    TransactionOpenError,
    Tx,
    TxScope,
)

__all__ = [
    "ChainBreak",
    "ForkedStoreError",
    "PageError",
    "ReadOnlyStoreError",
    "Store",
    "StoreClosedError",
    "StoreFullError",
    "StoreIOError",
    "StoreOpenError",
    "StoreWriteError",
    "TransactionEndedError",
    "TransactionOpenError",
    "Tx",
    "TxScope",
    "VerifyReport",
    "open_existing",
    "open_store",
]
