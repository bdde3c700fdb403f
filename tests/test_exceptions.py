"""The exception tree: hierarchy and pickling across the engine's process boundary."""

from __future__ import annotations

import pickle

import pytest

import asyncstream as a


def test_hierarchy() -> None:
    assert issubclass(a.ShardURLError, ValueError)
    assert issubclass(a.StateError, ValueError)
    assert issubclass(a.NotFoundError, a.PermanentFetchError)
    assert issubclass(a.AccessDeniedError, a.PermanentFetchError)
    assert issubclass(a.TransientFetchError, a.FetchError)
    assert issubclass(a.CorruptTarError, a.DataError)
    for cls in (a.FetchError, a.DataError, a.EngineError, a.ShardURLError, a.StateError):
        assert issubclass(cls, a.AsyncStreamError)


@pytest.mark.parametrize(
    "error",
    [
        a.NotFoundError("s3://b/k: not found", url="s3://b/k"),
        a.TransientFetchError("s3://b/k: SlowDown", url="s3://b/k"),
        a.CorruptTarError("s3://b/k: bad header", url="s3://b/k", offset=1536),
        a.EngineError("engine died"),
    ],
)
def test_errors_survive_pickling(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__
