"""Fixtures for the predictor tests that write files or train: everything goes OUTSIDE the package's
private temp base (conftest.py checks that it stays empty: it is for prefetch workers' ipc paths)."""
import os
import pathlib
import shutil
import tempfile

import pytest


@pytest.fixture
def scratch():
    d = tempfile.mkdtemp(prefix="sgt-pred-", dir="/tmp")
    try:
        yield pathlib.Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def inductor_cache_outside_the_temp_base():
    """torch.optim imports torch._dynamo, which makes a torchinductor_<user> cache dir under TMPDIR."""
    d = tempfile.mkdtemp(prefix="sgt-inductor-", dir="/tmp")
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
        shutil.rmtree(d, ignore_errors=True)
