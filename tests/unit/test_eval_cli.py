"""``peerwatch eval``'s options: ``--list``, ``--only`` by exact name with "did you mean"."""

from __future__ import annotations

import pytest

from peerwatch.cli import main
from peerwatch.commands.eval import chosen_scenarios
from peerwatch.errors import ConfigError
from peerwatch.streams.tools.eval_suites import suite


def test_only_takes_exact_names_in_suite_order() -> None:
    quick = suite("quick")
    picked = chosen_scenarios(["throttle-s1", "clock-8pct-s1"], quick)
    assert [s.name for s in picked] == ["clock-8pct-s1", "throttle-s1"]
    assert chosen_scenarios([], quick) == quick


def test_an_unknown_name_is_refused_with_the_closest_names() -> None:
    with pytest.raises(ConfigError, match="did you mean clock-8pct-s3"):
        chosen_scenarios(["clock-8pct-s4"], suite("quick"))
    with pytest.raises(ConfigError, match="see eval --list"):
        chosen_scenarios(["zzz"], suite("quick"))
    with pytest.raises(ConfigError, match="no scenario 'clock-8pct'"):
        chosen_scenarios(["clock-8pct"], suite("quick"))  # a substring is no longer a match


def test_list_prints_every_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--list"]) == 0
    assert capsys.readouterr().out.split() == [s.name for s in suite("quick")]
