import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="package", autouse=True)
def private_tmpdir():
    """Workers' ipc directories go under a temp base of our own, so checks for leftovers see only
    what these tests created (other processes on the machine may run prefetch workers too).
    Short on purpose: ipc:// paths must fit in 108 bytes."""
    base = tempfile.mkdtemp(prefix="sgt-", dir="/tmp")
    old_tempdir, old_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = base
    os.environ["TMPDIR"] = base
    try:
        yield base
    finally:
        tempfile.tempdir = old_tempdir
        if old_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_env
        leftovers = os.listdir(base)
        shutil.rmtree(base, ignore_errors=True)
        assert not leftovers, f"prefetch tests left files in the temp base: {leftovers}"
