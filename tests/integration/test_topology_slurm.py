"""The switch layout read from the real Slurm test cluster (no topology plugin: empty layout)."""

from __future__ import annotations

import pytest

from peerwatch.producers.slurm.command import SlurmCommands
from peerwatch.streams.core.topology import read_topology
from tests.integration.slurm_fixture import SlurmCluster

pytestmark = pytest.mark.integration


def test_read_topology_on_a_cluster_without_a_topology_plugin(slurm_cluster: SlurmCluster) -> None:
    topo = read_topology(SlurmCommands(slurm_cluster.bin_dir, timeout_s=30))
    # the cluster's one node is placed under no switch; nothing was misread
    assert topo.leaf(slurm_cluster.node) is None
    assert (dict(topo.switches), topo.problems) == ({}, ())
