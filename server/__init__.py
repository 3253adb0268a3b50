"""pymq broker (installed as ``pymq_server``): network front, broker core, holding storage, cluster, admin.

``pip install pymq-broker`` installs the SDK alone (no third-party package); the broker's own dependencies
come with the ``server`` extra.  A broker imported without them says so here, once, naming what is
missing and the command that brings it, instead of a bare ``No module named 'pydantic'`` from deep inside
(the SDK's vm:// seam and both commands show this message).
"""
from __future__ import annotations

from importlib.util import find_spec

#: the modules of the ``server`` extra (pyproject.toml) the broker cannot start without, with the
#: distribution that provides each
REQUIRED = {"yaml": "PyYAML", "pydantic": "pydantic", "aiohttp": "aiohttp", "wsproto": "wsproto",
            "google_crc32c": "google-crc32c", "prometheus_client": "prometheus_client"}


def missing_dependencies() -> list[str]:
    """The distributions of the ``server`` extra that are not installed (found without importing them)."""
    return [dist for module, dist in REQUIRED.items() if find_spec(module) is None]


_missing = missing_dependencies()
if _missing:
    raise ImportError(f"the pymq broker needs {', '.join(_missing)}, which this installation lacks: "
                      f"`pip install \"pymq-broker[server]\"` installs the broker's dependencies "
                      f"(`pip install pymq-broker` is the SDK alone)", name="pymq_server")
