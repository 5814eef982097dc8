"""Run by tests/test_distributed.py, once as a plain process and once under ``torchrun --nproc-per-node 2``.

``python tests/dist_worker.py zoo OUT`` trains a tiny breast-cancer zoo (11 runs: blocks of 8 and 3) through
the cached zoo function, a tiny HMC run (11 chains) and a population of 11 networks of 40 parameters (blocks
of 6 and 5); ``flow OUT`` trains a flat and a GNN flow for a few steps. Rank 0 saves what it got to ``OUT``.
"""
import sys
from dataclasses import replace

import torch

from wsbook import cache, distributed


def zoo() -> dict:
    from wsbook.bayes.mcmc import hmc
    from wsbook.experiments import targets
    from wsbook.experiments.tasks import get_task

    cfg = replace(targets.ZOOS["breast_cancer"], epochs=2, discard_epochs=1, every=3)
    z = targets._train_zoo(cfg, 11, 3)         # the cached function: rank 0 writes the entry
    lp = get_task("breast_cancer").log_posterior()
    gen = torch.Generator().manual_seed(4)
    run = hmc(lp, lp.init(11, generator=gen), n_samples=3, n_warmup=3, n_leapfrog=3, step_size=1e-3,
              generator=gen, compute_dtype=torch.float32)
    entries = [str(p) for p in sorted(cache.cache_dir().rglob("*.pt"))]
    # 40 parameters a network: blocks of 2 networks start on a vector boundary, so 11 split as 6 + 5
    from wsbook.nets import MLPSpec, train_population
    spec = MLPSpec((4, 4, 4))
    x, y = torch.randn(64, 4, generator=gen), torch.randint(0, 4, (64,), generator=gen)
    fine = train_population(spec, spec.init(11, generator=gen), x, y, steps=12, optimizer="sgd", lr=0.05,
                            momentum=0.9, batch_size=8, checkpoint_every=4, generator=gen, progress=False)
    sizes = distributed.shard_sizes(11, granule=distributed.granule_for(4 * spec.n_params))
    return {"theta": z["theta"], "run": z["run"], "step": z["step"], "hmc": run.samples,
            "hmc_step_size": run.step_size, "entries": entries, "fine": fine.checkpoints,
            "fine_sizes": torch.tensor(sizes)}


def flow() -> dict:
    from wsbook.nets import MLPSpec
    from wsbook.weightflow import EuclideanChart, FlatField, WeightFlow, gnn_field

    spec = MLPSpec((3, 4, 2))
    networks = spec.init(40, generator=torch.Generator().manual_seed(0))
    out = {}
    for name in ("flat", "gnn"):
        torch.manual_seed(1)                       # the same initial field on every process
        if name == "flat":
            fl = WeightFlow(EuclideanChart(spec), FlatField(spec, hidden=16, depth=2), coupling="ot")
        else:
            fl = WeightFlow(EuclideanChart(spec), gnn_field(spec, dim=4, n_layers=1), coupling="ot",
                            align_pairs=True)
        out[f"{name}_init"] = {k: v.detach().clone() for k, v in fl.field.state_dict().items()}
        fit = fl.fit(networks, steps=4, batch_size=10, lr=1e-2, generator=torch.Generator().manual_seed(2))
        out[name] = {k: v.detach().clone() for k, v in fl.field.state_dict().items()}
        out[f"{name}_losses"] = fit.losses
    return out


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    distributed.GATHER_PIECE_BYTES = 1000     # gather in many pieces, the last one partial
    distributed.init()
    result = {"zoo": zoo, "flow": flow}[mode]()
    result["world"] = distributed.world_size()
    if distributed.is_main():
        torch.save(result, path)
    distributed.close()
