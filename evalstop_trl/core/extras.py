"""Which optional install (an extra of the ``evalstop`` package) provides which module.

``pip install evalstop`` is the detectors, the clients, the embedded coordinator (SQLite) and the
command line; everything else is an extra (``pyproject.toml``, ``[project.optional-dependencies]``;
``tests/test_packaging.py`` ties this table to it). A command that needs a module of an extra not
installed says which extra to install (:func:`install_hint`) instead of a traceback.

Example::

    >>> install_hint(ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn"))
    "needs the 'service' extra (the module uvicorn is missing): pip install 'evalstop[service]'"
"""

from __future__ import annotations

__all__ = ["EXTRA_OF", "install_hint"]

#: top-level module -> the extra that installs it (numpy and PyYAML are also in ``calibrate``)
EXTRA_OF: dict[str, str] = {
    "fastapi": "service", "starlette": "service", "uvicorn": "service", "pydantic": "service",
    "httptools": "service", "prometheus_client": "service",
    "psycopg": "postgres", "psycopg_pool": "postgres",
    "numpy": "sim", "yaml": "sim", "tqdm": "sim",
    "matplotlib": "plots",
    "tensorboard": "calibrate",
    "ray": "ray",
    "scipy": "gavel",
    "torch": "train", "transformers": "train", "trl": "train", "accelerate": "train", "peft": "train",
    "datasets": "train",
}


def install_hint(exc: ModuleNotFoundError, extra: str | None = None) -> str | None:
    """What to install for a missing module of an extra (None for any other missing module: a bug,
    not an install). ``extra``: the extra of the command that ran (else the module's own)."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF:
        return None
    extra = extra or EXTRA_OF[top]
    return f"needs the {extra!r} extra (the module {top} is missing): pip install 'evalstop[{extra}]'"
