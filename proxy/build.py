"""What this build is: the package version and the Python running it (`--version`, `rampmeter_build_info`)."""

from __future__ import annotations

import functools
import platform
from importlib import metadata


@functools.cache
def version() -> str:
    """The installed distribution's version; "0+unknown" when running from a tree that was never installed."""
    try:
        return metadata.version("rampmeter")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def python_version() -> str:
    return platform.python_version()


def describe() -> str:
    return f"rampmeter {version()} (Python {python_version()}, {platform.python_implementation()})"
