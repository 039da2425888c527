import torch

from engine.kv_pool import KVLayout, KVPool


def resident_mib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


def test_a_cpu_pool_reads_as_zeros_and_takes_memory_only_as_it_is_written() -> None:
    layout = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16)
    before = resident_mib()
    pool = KVPool.allocate(layout, num_blocks=2048, block_size=16, device=torch.device("cpu"))
    pool_mib = layout.bytes_per_block(16) * 2048 // (1024 * 1024)
    assert pool_mib == 64
    assert resident_mib() - before < pool_mib // 4
    layer = pool.layers[0]
    assert layer.keys.shape == (2, 2048 * 16, 64) and layer.keys.is_contiguous()
    assert layer.keys.data_ptr() % 64 == 0
    assert not layer.keys.any() and not layer.values.any()
    slots = torch.tensor([5, 700])
    k = torch.ones(2, 2, 64, dtype=torch.bfloat16)
    layer.store(slots, k, 2 * k)
    assert layer.keys[:, slots].eq(1).all() and layer.values[:, slots].eq(2).all()
    assert int(layer.keys.sum()) == 2 * 2 * 64
    assert not pool.layers[1].keys.any()
