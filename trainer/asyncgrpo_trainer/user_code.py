"""Code a job names as "package.module:name" (env.function, env.class), imported in this process.

One place for how such a name is resolved and how a failure is reported: the spec field that named
it, what went wrong, and where the module must be for the driver to find it.
"""

from __future__ import annotations

import importlib

from asyncgrpo_trainer.datafiles import InvalidDataError


def import_named(field: str, spec: str) -> object | None:
    """The attribute `name` of `package.module` (None when the module has no such attribute), or
    InvalidDataError naming `field` when the module cannot be imported."""
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import runs arbitrary code: any error means "cannot be used"
        raise InvalidDataError(
            f"{field}: cannot import {module_name!r} ({type(exc).__name__}: {exc}); install the module "
            "in the trainer image or put it on its PYTHONPATH"
        ) from exc
    return getattr(module, name, None)
