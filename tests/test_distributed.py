"""torchrun on CPU (gloo): a zoo and HMC chains split over two processes equal the single-process run bit
for bit, and DDP flow training equals one process on the same global batch (to float tolerance)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wsbook import distributed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import dist_worker  # noqa: E402


def test_shards_are_whole_groups_and_cover_everything():
    assert distributed.shard_sizes(11, 2, granule=8) == [8, 3]
    assert distributed.shard_sizes(5, 2, granule=8) == [5, 0]
    assert distributed.shard_sizes(10, 3, granule=1) == [4, 3, 3]
    blocks = [distributed.shard(37, r, 4, granule=2) for r in range(4)]
    assert [i for b in blocks for i in range(37)[b]] == list(range(37))
    assert not distributed.active() and distributed.shard(5) == slice(0, 5)


def test_granule_puts_every_block_on_a_vector_boundary():
    assert [distributed.granule_for(4 * d) for d in (7960, 802, 25450, 32, 1)] == [2, 8, 8, 1, 16]
    assert distributed.granule_for(8) == distributed.GRANULE        # one float64 per HMC chain
    for row_bytes in (4 * 7960, 4 * 802, 4 * 41, 8 * 802):
        g = distributed.granule_for(row_bytes)
        for n, world in ((50, 2), (100, 2), (37, 3), (200, 4)):
            starts = [distributed.shard(n, r, world, granule=g).start for r in range(world)]
            assert all(s * row_bytes % distributed.ALIGN_BYTES == 0 for s in starts), (row_bytes, n, world)
    # a finer granule balances the blocks: 50 MNIST networks on 2 processes run as 26 + 24, not 32 + 18
    assert distributed.shard_sizes(50, 2, granule=distributed.granule_for(4 * 7960)) == [26, 24]
    for bad in (0, -8, 2.5, True):
        with pytest.raises(ValueError, match="row_bytes"):
            distributed.granule_for(bad)


@pytest.mark.parametrize("widths", [(3, 5, 2), (4, 4, 4), (30, 16, 16, 2)])   # granules 1, 2 and 8
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_population_blocks_train_as_in_the_whole_population(monkeypatch, one_thread, widths, optimizer):
    """Every rank's block of a population (as train_population cuts it under torchrun, simulated here in one
    process) trains bit for bit as the same members do in the whole population, with the fused optimizers."""
    from wsbook.nets import MLPSpec, train_population

    spec, B = MLPSpec(widths), 20
    gen = torch.Generator().manual_seed(0)
    theta0 = spec.init(B, generator=gen)
    x, y = torch.randn(64, widths[0], generator=gen), torch.randint(0, widths[-1], (64,), generator=gen)

    def train() -> torch.Tensor:
        return train_population(spec, theta0, x, y, steps=24, lr=0.05, optimizer=optimizer, momentum=0.9,
                                weight_decay=1e-4, batch_size=8, checkpoint_every=6, progress=False,
                                generator=torch.Generator().manual_seed(1)).checkpoints

    whole = train()
    monkeypatch.setattr(distributed, "active", lambda: True)
    monkeypatch.setattr(distributed, "all_gather_rows", lambda t, dim=0: t)
    g = distributed.granule_for(spec.n_params * theta0.element_size())
    for world in (2, 3):
        monkeypatch.setattr(distributed, "world_size", lambda: world)
        sizes = distributed.shard_sizes(B, world, granule=g)
        assert min(sizes) > 0 and max(sizes) < B
        for r in range(world):
            monkeypatch.setattr(distributed, "rank", lambda: r)
            rows = distributed.shard(B, r, world, granule=g)
            assert torch.equal(train(), whole[:, rows]), (widths, optimizer, world, r)


def _torchrun(mode: str, out: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WSBOOK_CACHE_DIR": str(cache),
           "WSBOOK_PROGRESS": "0", "WSBOOK_SCALE": "ci", "WSBOOK_DEVICE": "cpu"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tests" / "dist_worker.py"), mode, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=True)


@pytest.fixture
def single(monkeypatch, one_thread):
    monkeypatch.setenv("WSBOOK_DEVICE", "cpu")


def test_torchrun_zoo_and_hmc_equal_single_process(tmp_path, single):
    two = _torchrun("zoo", tmp_path / "two.pt", tmp_path / "cache2")
    one = dist_worker.zoo()
    assert two["world"] == 2
    for key in ("theta", "run", "step", "hmc", "hmc_step_size", "fine"):
        assert torch.equal(one[key].cpu(), two[key]), key
    assert two["fine_sizes"].tolist() == [6, 5]              # a finer split than whole blocks of 8
    # one cache entry, written once (by rank 0), under the same key as the single-process entry
    assert [Path(p).name for p in two["entries"]] == [Path(p).name for p in one["entries"]]
    assert len(two["entries"]) == 1


def test_torchrun_ddp_flow_equals_one_process_on_the_global_batch(tmp_path, single):
    two = _torchrun("flow", tmp_path / "two.pt", tmp_path / "cache2")
    one = dist_worker.flow()
    for field in ("flat", "gnn"):
        for name, value in one[field].items():
            torch.testing.assert_close(two[field][name], value, rtol=1e-5, atol=1e-6, msg=f"{field}: {name}")
        torch.testing.assert_close(two[f"{field}_losses"], one[f"{field}_losses"], rtol=1e-5, atol=1e-6)
        moved = max(float((one[field][k] - one[f"{field}_init"][k]).abs().max()) for k in one[field])
        assert moved > 1e-3, f"{field}: training did not move the field, so the comparison says nothing"


def test_field_autocast_is_an_option_and_off_on_the_cpu(one_thread):
    from wsbook.nets import MLPSpec
    from wsbook.weightflow import GeometricChart, WeightFlow, gnn_field

    spec = MLPSpec((3, 4, 2))
    nets = spec.init(40, generator=torch.Generator().manual_seed(0), device="cpu")
    losses = {}
    for autocast in (None, False, True):
        torch.manual_seed(1)
        flow = WeightFlow(GeometricChart(spec), gnn_field(spec, dim=4, n_layers=1), coupling="ot")
        losses[autocast] = flow.fit(nets, steps=4, batch_size=10, generator=torch.Generator().manual_seed(2),
                                    autocast=autocast).losses
        assert not flow._autocast                          # only inside fit
    assert torch.equal(losses[None], losses[False])        # the CPU default: float32, unchanged
    assert torch.isfinite(losses[True]).all() and not torch.equal(losses[True], losses[False])
    torch.testing.assert_close(losses[True], losses[False], rtol=0.05, atol=0.02)   # bfloat16: close, not equal


@pytest.mark.parametrize("chart", ["euclidean", "geometric"])
def test_fit_reads_no_value_on_the_host_per_step(one_thread, host_reads, chart):
    """With the NaN check spaced out (as on a GPU), a training step reads nothing on the host: 5 and 30
    steps read the same number of values (the setup's and the final check's). A check of the path's
    times or points, an ``.item()`` or a per-step NaN check in the loop would add reads every step."""
    from wsbook.nets import MLPSpec
    from wsbook.weightflow import EuclideanChart, GeometricChart, WeightFlow, gnn_field

    spec = MLPSpec((3, 4, 2))
    nets = spec.init(40, generator=torch.Generator().manual_seed(0), device="cpu")
    make = {"euclidean": lambda: EuclideanChart(spec), "geometric": lambda: GeometricChart(spec)}[chart]

    def reads(steps: int, **kw) -> int:
        torch.manual_seed(1)
        flow = WeightFlow(make(), gnn_field(spec, dim=4, n_layers=1), **kw)
        return host_reads(lambda: flow.fit(nets, steps=steps, batch_size=16, progress=False, check_every=1000,
                                           generator=torch.Generator().manual_seed(2)))

    assert reads(30) == reads(5)
    if chart == "euclidean":                      # the Gaussian path's noise too
        assert reads(30, path_sigma=0.01) == reads(5, path_sigma=0.01)
    # the CPU default checks every step (and so names the first bad step before it reaches the parameters)
    torch.manual_seed(1)
    flow = WeightFlow(make(), gnn_field(spec, dim=4, n_layers=1))
    per_step = host_reads(lambda: flow.fit(nets, steps=30, batch_size=16, progress=False,
                                           generator=torch.Generator().manual_seed(2))) - reads(30)
    assert per_step >= 29


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fit_does_not_synchronise_per_step_on_cuda(monkeypatch):
    """On a GPU, CUDA's sync debug mode reports every synchronising call: 5 and 55 steps of training (on
    a GNN field, under bfloat16 autocast) differ by at most the two extra NaN checks (every 25 steps)."""
    import warnings

    from wsbook.nets import MLPSpec
    from wsbook.weightflow import GeometricChart, WeightFlow, gnn_field

    monkeypatch.setenv("WSBOOK_PROGRESS", "0")
    spec = MLPSpec((3, 4, 2))
    nets = spec.init(40, generator=torch.Generator().manual_seed(0), device="cpu")

    def syncs(steps: int) -> int:
        torch.manual_seed(1)
        flow = WeightFlow(GeometricChart(spec), gnn_field(spec, dim=4, n_layers=1).cuda())
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                flow.fit(nets.cuda(), steps=steps, batch_size=16, generator=torch.Generator().manual_seed(2))
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return sum("synchroniz" in str(w.message) for w in caught)

    syncs(5)                                      # warm up (lazy initialisation may synchronise once)
    assert syncs(55) - syncs(5) <= 2
