"""Packages per role: every extra the CLI names exists, and a missing extra is named, not a
traceback. (That the node code paths import no heavy module: tests/integration/test_install_roles.py.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from peerwatch import cli
from peerwatch.extras import EXTRA_OF_MODULE, MissingExtraError, missing_extra

ROOT = Path(__file__).resolve().parents[2]


def test_every_extra_named_for_a_module_exists_in_pyproject() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)
    # [dev] keeps installing everything (scripts/setup.sh installs '.[dev]').
    assert "peerwatch[all,test]" in extras["dev"]
    named = extras["all"][0]
    assert all(e in named for e in extras if e not in ("all", "test", "dev"))


def test_missing_extra_names_the_extra_of_a_submodule() -> None:
    exc = ModuleNotFoundError("No module named 'numba.core'", name="numba.core")
    found = missing_extra(exc)
    assert isinstance(found, MissingExtraError) and found.extra == "stream"
    assert "pip install 'peerwatch[stream]'" in str(found)
    # A module of peerwatch's own is a bug: no extra, the traceback stays.
    assert missing_extra(ModuleNotFoundError("x", name="peerwatch.nothing")) is None


def test_cli_turns_a_missing_extra_into_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import peerwatch.commands.config as config_command

    def run(_args: object) -> int:
        raise ModuleNotFoundError("No module named 'faust'", name="faust")

    real = config_command.register

    def register(sub: object) -> None:
        real(sub)
        sub.choices["config"].set_defaults(func=run)  # type: ignore[attr-defined]

    monkeypatch.setattr(config_command, "register", register)
    assert cli.main(["config"]) == 2
    assert "peerwatch config: needs the Python module 'faust'" in capsys.readouterr().err


def test_cli_keeps_the_traceback_of_a_module_no_extra_provides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import peerwatch.commands.config as config_command

    def run(_args: object) -> int:
        raise ModuleNotFoundError("No module named 'peerwatch.gone'", name="peerwatch.gone")

    real = config_command.register

    def register(sub: object) -> None:
        real(sub)
        sub.choices["config"].set_defaults(func=run)  # type: ignore[attr-defined]

    monkeypatch.setattr(config_command, "register", register)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["config"])
