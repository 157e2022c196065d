import os
import shutil

import pytest


def pytest_collection_modifyitems(config, items):
    """GPU tests need CUDA: skip them (visibly, with the reason) on machines without it."""
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (tests/gpu runs on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
