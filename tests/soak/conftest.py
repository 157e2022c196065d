"""Soak tests run only when asked (``pytest -m soak tests/soak``; .ci/run does it as its own bounded
step). A plain ``pytest`` over tests/ deselects them (reported as deselected, not as passed)."""


def pytest_collection_modifyitems(config, items):
    if "soak" in (config.option.markexpr or ""):
        return
    keep, drop = [], []
    for item in items:
        (drop if "soak" in item.keywords else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
