"""One module per ``peerwatch`` subcommand; each exposes ``register(subparsers)``."""

from __future__ import annotations

import argparse

from peerwatch.settings import Settings, load_settings


def settings_of(args: argparse.Namespace) -> Settings:
    """The process settings, honouring ``--config``."""
    return load_settings(getattr(args, "config", None))
