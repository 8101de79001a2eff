"""Fixtures of the integration tests that need no broker."""
import pytest

from .staged import Pipe


@pytest.fixture
def make_pipe(tmp_path):
    """A pipeline whose batches a test stages by hand (staged.py)."""
    def make(**kw) -> Pipe:
        return Pipe(tmp_path / "pipelines", **kw)
    return make
