"""Hostlist expansion and compression (peerwatch.producers.slurm.hostlist)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.hostlist import MAX_HOSTS, compress, expand


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("vm", ["vm"]),
        ("", []),
        ("gpu[1-2,07]", ["gpu1", "gpu2", "gpu07"]),
        ("a[01-03]b", ["a01b", "a02b", "a03b"]),
        ("n1,n[3-4]", ["n1", "n3", "n4"]),
        ("gpu[07-10]", ["gpu07", "gpu08", "gpu09", "gpu10"]),
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu[001-002],cpu[9-10],login", ["gpu001", "gpu002", "cpu9", "cpu10", "login"]),
        (" a1 , b[2] ", ["a1", "b2"]),
        ("n[3,1]", ["n3", "n1"]),
    ],
)
def test_expand(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize(
    "expr",
    ["gpu[1-2", "gpu1-2]", "gpu[]", "gpu[a-b]", "gpu[3-1]", "gpu[[1-2]]", "gpu[1-2-3]", "n[1,]"],
)
def test_expand_rejects_malformed(expr: str) -> None:
    with pytest.raises(SlurmParseError, match="hostlist"):
        expand(expr)


def test_expand_is_a_value_error_and_bounded() -> None:
    with pytest.raises(ValueError, match=str(MAX_HOSTS)):
        expand("n[0-99999999]")
    with pytest.raises(ValueError, match=str(MAX_HOSTS)):
        expand("a[0-9999]b[0-9999]")


@pytest.mark.parametrize(
    ("hosts", "expr"),
    [
        (["gpu1", "gpu2", "gpu3"], "gpu[1-3]"),
        (["gpu07", "gpu08", "gpu10"], "gpu10,gpu[07-08]"),
        (["n1", "n3", "n4", "n4"], "n[1,3-4]"),
        (["a01b", "a02b"], "a[01-02]b"),
        (["login", "gpu5"], "gpu5,login"),
        ([], ""),
    ],
)
def test_compress(hosts: list[str], expr: str) -> None:
    assert compress(hosts) == expr


@pytest.mark.parametrize("bad", ["", "a,b", "n[1]", " n1"])
def test_compress_rejects_names_it_cannot_express(bad: str) -> None:
    with pytest.raises(SlurmParseError):
        compress([bad])


_NAMES = st.builds(
    lambda prefix, number, width, suffix: f"{prefix}{str(number).zfill(width)}{suffix}",
    st.sampled_from(["gpu", "n", "rack1-n", "a", ""]),
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=0, max_value=4),
    st.sampled_from(["", "b", "-ib"]),
) | st.sampled_from(["login", "head", "x"])


@given(st.lists(_NAMES, max_size=40))
def test_compress_then_expand_gives_the_same_hosts(hosts: list[str]) -> None:
    expr = compress(hosts)
    expanded = expand(expr)
    assert sorted(expanded) == sorted(set(hosts))
    assert compress(expanded) == expr


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["gpu", "n"]),
            st.integers(min_value=0, max_value=50),
            st.integers(min_value=0, max_value=5),
            st.integers(min_value=1, max_value=3),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_expand_then_compress_round_trips(ranges: list[tuple[str, int, int, int]]) -> None:
    expr = ",".join(
        f"{p}[{str(lo).zfill(w)}-{str(lo + span).zfill(w)}]" for p, lo, span, w in ranges
    )
    hosts = expand(expr)
    assert len(hosts) == sum(span + 1 for _, _, span, _ in ranges)
    assert sorted(set(expand(compress(hosts)))) == sorted(set(hosts))
