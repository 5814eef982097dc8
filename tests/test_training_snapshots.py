"""Copies of a flow's sampling EMA kept during training (``WeightFlow.fit(snapshot_steps=...)``), the MNIST
experiment that samples them (``mnist_flows.snapshot_steps``) and the figure that reads them
(``figures.accuracy_along_training``)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from wsbook import figures
from wsbook.experiments import mnist_flows as mf
from wsbook.nets import MLPSpec
from wsbook.weightflow import EuclideanChart, FlatField, GeometricChart, WeightFlow, gnn_field

SPEC = MLPSpec((4, 5, 3))


def _flow(kind: str) -> WeightFlow:
    torch.manual_seed(0)
    if kind == "flat":
        return WeightFlow(EuclideanChart(SPEC), FlatField(SPEC, hidden=16, depth=2), coupling="ot")
    return WeightFlow(GeometricChart(SPEC), gnn_field(SPEC, dim=4, n_layers=1))


def _fit(kind: str, **kwargs):
    flow = _flow(kind)
    nets = SPEC.init(24, generator=torch.Generator().manual_seed(1), device="cpu")
    res = flow.fit(nets, steps=7, batch_size=8, lr=1e-2, ema_decay=0.9, generator=torch.Generator().manual_seed(2),
                   progress=False, **kwargs)
    return flow, res


@pytest.mark.parametrize("kind", ["flat", "gnn"])
def test_snapshots_change_nothing_and_end_at_the_final_ema(kind):
    plain_flow, plain = _fit(kind)
    flow, res = _fit(kind, snapshot_steps=[7, 2, 4, 2])
    assert plain.snapshots == []
    assert torch.equal(plain.losses, res.losses), "keeping copies draws no random numbers"
    final = flow.ema.state_dict()
    for k, v in plain_flow.ema.state_dict().items():
        assert torch.equal(v, final[k])
    assert [s for s, _ in res.snapshots] == [2, 4, 7], "sorted, each kept once"
    last = res.snapshots[-1][1]
    assert all(torch.equal(last[k], v) for k, v in final.items()), "the copy after every step is the final EMA"
    # the copies are copies: the EMA moved on after the earlier ones, and loading one changes the samples
    early = res.snapshots[0][1]
    assert any(not torch.equal(early[k], v) for k, v in final.items())
    assert all(v.device.type == "cpu" for v in early.values())
    g = torch.Generator().manual_seed(3)
    x0 = flow.chart.sample_source(5, g)
    end = flow.sample(5, steps=3, x0=x0.clone())
    flow.ema.load_state_dict(early)
    assert not torch.equal(flow.sample(5, steps=3, x0=x0.clone()), end)


@pytest.mark.parametrize("bad", [[0], [8], [-1], [2, 9], [2.0], [True], "7", 7])
def test_snapshot_steps_out_of_range_raise_before_any_work(bad):
    flow = _flow("flat")
    scale = flow.layer_scale.clone()
    with pytest.raises(ValueError, match="snapshot"):
        flow.fit(SPEC.init(8, device="cpu"), steps=7, batch_size=4, snapshot_steps=bad, progress=False)
    assert torch.equal(flow.layer_scale, scale), "nothing changed"


def test_snapshot_step_counts():
    for steps, k in ((150, 10), (3000, 10), (600, 10), (5, 10), (1, 3)):
        s = mf.snapshot_steps(steps, k)
        assert s[-1] == steps and s[0] >= 1 and list(s) == sorted(set(s)) and len(s) <= k
    assert len(mf.snapshot_steps(3000, 10)) == 10
    with pytest.raises(ValueError):
        mf.snapshot_steps(0, 4)
    with pytest.raises(ValueError):
        mf.snapshot_steps(100, 0)


def test_accuracy_along_training_figure():
    runs = {"geometric_aligned_ot": {"steps": torch.tensor([10, 100, 1000]),
                                     "accuracy": torch.tensor([[0.1, 0.2], [0.5, 0.7], [0.8, 0.82]])},
            "plain baseline": {"steps": torch.tensor([5, 50, 500]),
                               "accuracy": torch.tensor([[0.1, 0.1], [0.3, 0.5], [0.6, 0.7]])}}
    fig = figures.accuracy_along_training(runs, reference=0.85, title="t")
    lines = [t for t in fig.data if t.mode and "lines" in t.mode and t.fill is None]
    assert [t.name for t in lines] == [figures.label(r) for r in runs]
    np.testing.assert_allclose(lines[0].y, [0.15, 0.6, 0.81])
    np.testing.assert_allclose(lines[1].x, [5, 50, 500])
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 2
    se = np.std([0.8, 0.82], ddof=1) / np.sqrt(2)
    assert max(bands[0].y) == pytest.approx(0.81 + se)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.title.text
    assert any(s.y0 == 0.85 for s in fig.layout.shapes), "the zoo's accuracy as a reference line"
    summary = figures.accuracy_along_training(runs, band="std").data
    assert max(summary[0].y) == pytest.approx(0.81 + np.std([0.8, 0.82], ddof=1))
    with pytest.raises(ValueError, match="band"):
        figures.accuracy_along_training(runs, band="iqr")
    with pytest.raises(ValueError, match="accuracy"):
        figures.accuracy_along_training({"x": {"steps": torch.tensor([1, 2]), "accuracy": torch.zeros(3, 2)}})
