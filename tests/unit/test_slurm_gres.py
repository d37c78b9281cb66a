"""GRES string parsing (peerwatch.producers.slurm.gres)."""

from __future__ import annotations

import pytest

from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.gres import GresEntry, gpu_indices, parse_gres, parse_index_list


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        ("gpu:3(IDX:0-2)", [GresEntry("gpu", None, 3, (0, 1, 2), {"IDX": "0-2"})]),
        ("gpu:h100:4(IDX:0-3)", [GresEntry("gpu", "h100", 4, (0, 1, 2, 3), {"IDX": "0-3"})]),
        ("gpu:a100:2(IDX:0,2)", [GresEntry("gpu", "a100", 2, (0, 2), {"IDX": "0,2"})]),
        ("gpu(IDX:N/A)", [GresEntry("gpu", None, None, None, {"IDX": "N/A"})]),
        ("gpu:8", [GresEntry("gpu", None, 8)]),
        ("gpu:h100", [GresEntry("gpu", "h100", None)]),
        ("gpu:h100:8(S:0-1)", [GresEntry("gpu", "h100", 8, None, {"S": "0-1"})]),
        ("mps:1K", [GresEntry("mps", None, 1024)]),
        (
            "gpu:h100:2(IDX:0-1),nic:1",
            [GresEntry("gpu", "h100", 2, (0, 1), {"IDX": "0-1"}), GresEntry("nic", None, 1)],
        ),
        (
            "gpu:a100:1(IDX:4),gpu:h100:2(IDX:0,6)",
            [
                GresEntry("gpu", "a100", 1, (4,), {"IDX": "4"}),
                GresEntry("gpu", "h100", 2, (0, 6), {"IDX": "0,6"}),
            ],
        ),
        ("", []),
        ("(null)", []),
        ("N/A", []),
    ],
)
def test_parse_gres(text: str, entries: list[GresEntry]) -> None:
    assert list(parse_gres(text)) == entries


@pytest.mark.parametrize(
    ("text", "indices"),
    [
        ("gpu:3(IDX:0-2)", (0, 1, 2)),
        ("gpu:h100:2(IDX:0-1),nic:1", (0, 1)),
        ("gpu:a100:1(IDX:4),gpu:h100:2(IDX:0,6)", (4, 0, 6)),
        ("gpu(IDX:N/A)", ()),
        ("nic:1", ()),
        ("", ()),
    ],
)
def test_gpu_indices(text: str, indices: tuple[int, ...]) -> None:
    assert gpu_indices(text) == indices


def test_index_list_keeps_order() -> None:
    assert parse_index_list("5,0-1, 3") == (5, 0, 1, 3)


@pytest.mark.parametrize(
    "text",
    [
        "gpu:3(IDX:0-2",
        "gpu:3)IDX(",
        "gpu:3(IDX:2-0)",
        "gpu:3(IDX:x)",
        "gpu:h100:two",
        "gpu:a:b:c",
        "gpu::2",
        ":2",
        "gpu:2(IDX:0)x",
        "gpu:2(0-1)",
    ],
)
def test_malformed_gres_raises_a_value_error(text: str) -> None:
    with pytest.raises(SlurmParseError, match="GRES"):
        parse_gres(text)
    with pytest.raises(ValueError):
        gpu_indices(text)


def test_non_string_is_rejected() -> None:
    with pytest.raises(SlurmParseError, match="string"):
        parse_gres(None)  # type: ignore[arg-type]
