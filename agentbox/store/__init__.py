"""The storage interface: `Store` is everything the receiver, dispatcher,
callback deliverer, API, page and CLI may ask of the database. Nothing outside
this package sees an engine class, a connection or a line of SQL.

Every engine (SQLite now, PostgreSQL for several instances) implements `Store`
with the same guarantees, checked by one conformance suite:

- `ingest` writes the event, its idempotency claim and its run(s) in one
  transaction and returns only once that transaction is durable.
- A run changes state only along `runs.TRANSITIONS`; a terminal run is never
  claimed again.
- `finish` only lands for the current lease holder and attempt, so an outcome
  reported after the lease was lost (and the run reclaimed) is dropped.
"""

from agentbox.store.interface import *  # noqa: F403
from agentbox.store.interface import __all__ as __all__
