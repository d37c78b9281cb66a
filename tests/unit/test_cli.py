"""The ``peerwatch`` command line: grouped help, a description and a working example for every
command, global flags after the command, "did you mean"."""

from __future__ import annotations

import shlex

import pytest

from peerwatch.cli import COMMANDS, EXAMPLES, GROUPS, build_parser, command_of, main


def test_every_command_has_a_group_a_description_and_an_example_that_parses() -> None:
    grouped = [n for names in GROUPS.values() for n in names]
    assert sorted(grouped) == sorted(COMMANDS) and set(EXAMPLES) == set(COMMANDS)
    parser = build_parser()
    for name, example in EXAMPLES.items():
        args = parser.parse_args(shlex.split(example)[1:])  # exits 2 on a stale example
        assert args.command == name
    text = parser.format_help()
    services = text.index("services (long-running")
    dev = text.index("development and evaluation")
    assert services < text.index("  stream ") < text.index("  drain-controller ") < dev
    assert dev < text.index("  demo ") and dev < text.index("  bench ")


def test_a_command_help_has_its_description_and_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["job", "--help"])
    out = capsys.readouterr().out
    assert "One job's GPUs against their peers, and a verdict." in out
    assert "example:\n  peerwatch job 123456" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "/c.toml", "-v", "replay", "--kafka"],
        ["replay", "--kafka", "--config", "/c.toml", "-v"],
        ["replay", "--config", "/c.toml", "--kafka", "--verbose"],
    ],
)
def test_global_flags_work_before_or_after_the_command(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.config, args.verbose, args.command) == ("/c.toml", True, "replay")


def test_flags_of_a_nested_command_and_defaults() -> None:
    args = build_parser().parse_args(["export", "stdout", "--config", "/c.toml"])
    assert args.config == "/c.toml" and args.verbose is False
    assert build_parser().parse_args(["--config", "/a", "topics", "list"]).config == "/a"


def test_a_mistyped_command_gets_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jbo", "42"]) == 2
    assert "unknown command 'jbo'; did you mean job?" in capsys.readouterr().err
    assert main(["--config", "x.toml", "xyzzy\x1b[2J"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "\x1b" not in err
    assert command_of(["--config", "job", "replay"]) == "replay"  # a --config value is no command
