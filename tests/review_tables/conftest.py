"""The review's tables (agentbox/archive/history.py, its own migration line) on every
engine: the store conformance suite's engines and fixtures, for the review's tests."""

from tests.store.conftest import aio, engine, make_store, store

__all__ = ["aio", "engine", "make_store", "store"]
