"""Placement on a real Ray cluster of two simulated nodes with four declared GPU slots each."""

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from slime_like.ray.placement import create_placement  # noqa: E402


@pytest.fixture(scope="module")
def two_node_cluster():
    from slime_like.ray.cluster import enable_token_auth

    enable_token_auth()  # the test cluster's nodes inherit this process's token, as a run's private Ray does
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, num_gpus=4, include_dashboard=False,
                                                                object_store_memory=128 * 1024 ** 2))
    cluster.add_node(num_cpus=1, num_gpus=4, object_store_memory=128 * 1024 ** 2)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_bundles_sorted_node_major_and_engines_stay_on_one_node(two_node_cluster):
    placement = create_placement(8)
    try:
        nodes = [b.node_id for b in placement.bundles]
        # node-major: the first four slots on one node, the last four on the other
        assert len(set(nodes[:4])) == 1 and len(set(nodes[4:])) == 1 and nodes[0] != nodes[4]
        assert [b.gpu_id for b in placement.bundles] == [0, 1, 2, 3, 0, 1, 2, 3]
        placement.check_same_node([[0, 1], [2, 3], [4, 5], [6, 7]])  # 2-GPU engines: fine
        with pytest.raises(RuntimeError, match="span 2 nodes"):
            placement.check_same_node([[2, 3, 4]])

        @ray.remote(num_cpus=0)
        def where():
            return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids()

        # an actor pinned to slot 5 lands on the second node's GPU 1
        node, gpus = ray.get(where.options(num_gpus=0.5, scheduling_strategy=placement.strategy(5)).remote())
        assert node == nodes[5] and [int(g) for g in gpus] == [1]
    finally:
        placement.remove()


def test_too_many_slots_fail_with_a_clear_error(two_node_cluster):
    with pytest.raises(RuntimeError, match="could not reserve 9 GPU slots"):
        create_placement(9, timeout_s=3)
