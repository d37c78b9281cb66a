"""One module per ``peerwatch`` subcommand; each exposes ``register(subparsers)``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from peerwatch.settings import Settings, load_settings, with_overrides


def settings_of(args: argparse.Namespace, overrides: Mapping[str, Any] | None = None) -> Settings:
    """The process settings (``--config``, then the environment), with ``overrides``
    (``{"table.field": flag value}``; None = flag not given) from the command's own flags."""
    settings = load_settings(
        getattr(args, "config", None), drain_file=getattr(args, "drain_config", None)
    )
    return with_overrides(settings, overrides or {})
