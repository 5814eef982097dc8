"""The experiments of chapter 5, as functions the chapter calls: trained zoos (cached), a comparison of
alignment methods by barrier / AUC / runtime, a width sweep, variational posteriors, SIREN INRs of a
2-D shape, and canonicalization on the product of spheres. Each returns plain tensors and numbers.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from wsbook import config
from wsbook.cache import cached
from wsbook.nets import MLPSpec, train_population
from wsbook.symmetry.canonical import canonicalize, normalize_neurons, sphere_distance
from wsbook.symmetry.lmc import auc, barrier, connectivity, gaussian_interpolation_curve
from wsbook.symmetry.matching import (activation_matching, sign_aware_weight_matching, sinkhorn_matching,
                                      variational_matching, weight_matching)

ALIGNMENT_METHODS = ("naive", "weight_matching", "activation_matching", "sinkhorn_l2", "sinkhorn_midpoint",
                     "sinkhorn_random", "wm_sinkhorn")

#: DEEP-ALIGN (Navon et al., 2024) Table 1, MNIST MLPs: (barrier, AUC); published, not computed here
PUBLISHED_MNIST = {"naive": (2.007, 0.835), "weight_matching": (0.047, 0.011), "activation_matching": (0.024, 0.007),
                   "sinkhorn": (0.027, 0.002), "wm_sinkhorn": (0.012, 0.000)}


def _data(name: str):
    from wsbook import data

    return data.load(name)


@cached(version="1")
def train_zoo(spec: MLPSpec, dataset: str, n: int, *, steps: int, lr: float = 3e-3, batch_size: int = 64,
              weight_decay: float = 0.0, seed: int = 0) -> Tensor:
    """``n`` networks trained independently (different initialisations and minibatch orders) on a dataset
    of :mod:`wsbook.data`, all in one population: ``[n, D]`` (cached)."""
    ds = _data(dataset)
    gen = torch.Generator().manual_seed(seed)
    theta0 = spec.init(n, generator=gen)
    return train_population(spec, theta0, ds.x_train, ds.y_train, steps=steps, lr=lr, batch_size=batch_size,
                            weight_decay=weight_decay, generator=gen,
                            loss="cross_entropy" if ds.n_classes else "mse").theta


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def compare_alignments(spec: MLPSpec, theta_a: Tensor, theta_b: Tensor, x_fit: Tensor, y_fit: Tensor,
                       x_eval: Tensor, y_eval: Tensor, *, methods: Sequence[str] = ALIGNMENT_METHODS,
                       sinkhorn_steps: int = 100, n_points: int = 25, task: str = "classification",
                       generator: torch.Generator | None = None) -> dict[str, dict]:
    """Align every ``theta_b[i]`` to ``theta_a[i]`` with each method (all pairs in one batch) and measure the
    barrier and AUC of the interpolation loss on ``(x_eval, y_eval)`` and the wall time per pair
    (DEEP-ALIGN's protocol, Navon et al., 2024). Data-based methods use ``(x_fit, y_fit)``."""
    unknown = set(methods) - set(ALIGNMENT_METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {ALIGNMENT_METHODS}")
    B = theta_a.shape[0]
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    aligned, seconds = {}, {}
    wm = None
    for m in methods:
        if m == "naive":
            aligned[m], seconds[m] = theta_b, 0.0
        elif m == "weight_matching" or (m == "wm_sinkhorn" and wm is None):
            res, t = _timed(weight_matching, spec, theta_a, theta_b, generator=gen)
            wm, aligned["weight_matching"], seconds["weight_matching"] = res.perms, res.aligned, t
        if m == "activation_matching":
            res, seconds[m] = _timed(activation_matching, spec, theta_a, theta_b, x_fit)
            aligned[m] = res.aligned
        elif m.startswith("sinkhorn_"):
            res, seconds[m] = _timed(sinkhorn_matching, spec, theta_a, theta_b, x_fit, y_fit,
                                     loss=m.split("_")[1], steps=sinkhorn_steps, task=task, generator=gen)
            aligned[m] = res.aligned
        elif m == "wm_sinkhorn":
            res, t = _timed(sinkhorn_matching, spec, theta_a, theta_b, x_fit, y_fit, loss="midpoint",
                            steps=sinkhorn_steps, init=wm, init_strength=1.0, task=task, generator=gen)
            aligned[m] = res.aligned
            seconds[m] = t + seconds["weight_matching"]
    out = {}
    for m in methods:
        res = connectivity(spec, theta_a, aligned[m], x_eval, y_eval, n_points=n_points, task=task)
        out[m] = {**res, "seconds_per_pair": seconds[m] / B, "aligned": aligned[m]}
    return out


def width_sweep(widths: Sequence[int], *, dataset: str = "digits", depth: int = 2, n_pairs: int = 3,
                steps: int = 500, lr: float = 3e-3, seed: int = 0) -> dict[str, Tensor]:
    """Barrier against hidden width, before and after weight / activation matching (Entezari et al., 2022;
    Ainsworth et al., 2023): ``{"widths": [K], "naive"|"weight_matching"|"activation_matching": [K, n_pairs]}``."""
    ds = _data(dataset)
    rows = {"naive": [], "weight_matching": [], "activation_matching": []}
    gen = torch.Generator().manual_seed(seed)
    for w in widths:  # a loop over architectures, not over networks
        spec = MLPSpec((ds.x_train.shape[1],) + (int(w),) * depth + (ds.n_classes,))
        zoo = train_zoo(spec, dataset, 2 * n_pairs, steps=steps, lr=lr, seed=seed)
        a, b = zoo[:n_pairs], zoo[n_pairs:]
        cands = {"naive": b, "weight_matching": weight_matching(spec, a, b, generator=gen).aligned,
                 "activation_matching": activation_matching(spec, a, b, ds.x_train).aligned}
        for name, cand in cands.items():
            rows[name].append(connectivity(spec, a, cand, ds.x_test, ds.y_test)["barrier"])
    return {"widths": torch.tensor(list(widths)), **{k: torch.stack(v) for k, v in rows.items()}}


# ------------------------------------------------------------- variational
@cached(version="1")
def fit_variational_zoo(spec: MLPSpec, dataset: str, n: int, *, steps: int, lr: float = 1e-2,
                        prior_std: float = 1.0, batch_size: int = 128, seed: int = 0) -> dict[str, Tensor]:
    """``n`` independent mean-field Gaussian posteriors (Bayes by backprop via ``wsbook.bayes.vi``), cached:
    ``{"mean": [n, D], "std": [n, D]}``."""
    from wsbook.bayes.vi import fit_mean_field

    ds = _data(dataset)
    q = fit_mean_field(spec, ds.x_train, ds.y_train, n_members=n, steps=steps, lr=lr, prior_std=prior_std,
                       batch_size=batch_size, generator=torch.Generator().manual_seed(seed), init_std=1e-3)
    return {"mean": q.mean, "std": q.std}


def variational_barriers(spec: MLPSpec, mean: Tensor, std: Tensor, x: Tensor, y: Tensor, *, n_samples: int = 32,
                         n_points: int = 25, seed: int = 0) -> dict[str, dict]:
    """Marginalized loss along the Wasserstein geodesic between pairs of posteriors (first half against
    second half), naive and after variational matching, and along the mixture path (Rossi et al., 2023)."""
    n = mean.shape[0] // 2
    ma, sa, mb, sb = mean[:n], std[:n], mean[n:2 * n], std[n:2 * n]
    matched = variational_matching(spec, ma, sa, mb, sb, generator=torch.Generator().manual_seed(seed))
    mb_al, sb_al = matched.mean, matched.std
    out = {}
    for name, (m2, s2, path) in {"naive": (mb, sb, "wasserstein"), "aligned": (mb_al, sb_al, "wasserstein"),
                                 "mixture": (mb, sb, "mixture")}.items():
        curve = gaussian_interpolation_curve(spec, ma, sa, m2, s2, x, y, path=path, n_points=n_points,
                                             n_samples=n_samples, generator=torch.Generator().manual_seed(seed))
        out[name] = {**curve, "barrier": barrier(curve), "auc": auc(curve)}
    return out


# -------------------------------------------------------------------- INRs
def shape_sdf(n_grid: int = 32, shape: str = "star") -> tuple[Tensor, Tensor]:
    """A 2-D shape as a signed distance field sampled on an ``n_grid x n_grid`` grid of ``[-1, 1]^2``:
    ``x [n^2, 2]``, ``y [n^2, 1]`` (negative inside). ``star``: a five-pointed star (polar boundary
    ``r(phi) = 0.5 + 0.15 cos 5 phi``, radial distance approximation); ``circle``: radius 0.5."""
    g = torch.linspace(-1, 1, n_grid)
    xx, yy = torch.meshgrid(g, g, indexing="xy")
    x = torch.stack([xx.flatten(), yy.flatten()], 1)
    r, phi = x.norm(dim=1), torch.atan2(x[:, 1], x[:, 0])
    if shape == "star":
        boundary = 0.5 + 0.15 * torch.cos(5 * phi)
    elif shape == "circle":
        boundary = torch.full_like(r, 0.5)
    else:
        raise ValueError(f"shape must be 'star' or 'circle'; got {shape!r}")
    return x.to(config.device()), (r - boundary).unsqueeze(1).to(config.device())


@cached(version="1")
def fit_inr_pairs(spec: MLPSpec, n_pairs: int, *, n_grid: int = 32, steps: int = 1000, lr: float = 1e-4,
                  batch_size: int = 256, seed: int = 0) -> dict[str, Tensor]:
    """SIRENs fitted to :func:`shape_sdf` (De Luigi et al., 2023's INR setting, in 2-D): ``a`` and ``same``
    share an initialisation but see different minibatch orders; ``diff`` starts from its own initialisation.
    Returns ``{"a", "same", "diff"}``, each ``[n_pairs, D]``."""
    x, y = shape_sdf(n_grid)
    gen = torch.Generator().manual_seed(seed)
    init_a, init_d = spec.init(n_pairs, "siren", generator=gen), spec.init(n_pairs, "siren", generator=gen)
    theta0 = torch.cat([init_a, init_a, init_d])
    fit = train_population(spec, theta0, x, y, steps=steps, lr=lr, loss="mse", batch_size=batch_size, generator=gen)
    a, same, diff = fit.theta.split(n_pairs)
    return {"a": a, "same": same, "diff": diff}


def inr_paths(spec: MLPSpec, nets: dict[str, Tensor], *, n_grid: int = 32, n_points: int = 25) -> dict[str, dict]:
    """Reconstruction loss along the segment for the four settings of Ballerini (2023): same initialisation,
    different initialisations, different + weight matching, different + activation matching; for odd
    activations also different + sign-aware weight matching (Boufalis et al., 2025)."""
    x, y = shape_sdf(n_grid)
    a = nets["a"]
    gen = torch.Generator().manual_seed(0)
    cands = {"same": nets["same"], "diff": nets["diff"],
             "diff_weight_matching": weight_matching(spec, a, nets["diff"], generator=gen).aligned,
             "diff_activation_matching": activation_matching(spec, a, nets["diff"], x).aligned}
    if spec.activation in ("sine", "tanh"):   # odd activations: permutations and sign flips together
        cands["diff_sign_aware"] = sign_aware_weight_matching(spec, a, nets["diff"], generator=gen).aligned
    return {k: connectivity(spec, a, v, x, y, n_points=n_points, task="regression") for k, v in cands.items()}


# --------------------------------------------------------- canonicalization
def canonical_distances(spec: MLPSpec, zoo: Tensor, x: Tensor) -> dict[str, Tensor]:
    """Geodesic distances on the product of spheres from member 0 to the others, after normalization only
    (scaling broken) and after full canonicalization against member 0 (permutations broken too), with the
    functions' changes (relative output difference in regression mode, label agreement in classification
    mode)."""
    ref = zoo[:1]
    normalized = normalize_neurons(spec, zoo)
    canonical = canonicalize(spec, zoo, ref, generator=torch.Generator().manual_seed(0))
    exact = canonicalize(spec, zoo, ref, task="regression", generator=torch.Generator().manual_seed(0))
    from wsbook.symmetry.actions import function_difference

    with torch.no_grad():
        same_labels = (spec.forward(canonical, x).argmax(-1) == spec.forward(zoo, x).argmax(-1)).float().mean(1)
    return {"normalized": normalized, "canonical": canonical,
            "distance_normalized": sphere_distance(spec, normalized[:1], normalized[1:]),
            "distance_canonical": sphere_distance(spec, canonical[:1], canonical[1:]),
            "function_change": function_difference(spec, zoo, exact, x), "label_agreement": same_labels}


def neurons_on_sphere_figure(spec: MLPSpec, normalized: Tensor, canonical: Tensor, members: int = 3):
    """First-layer neurons ``[w_1, w_2, b]`` of 2-input networks on the unit sphere S^2, one colour per network:
    left after normalization only, right after canonicalization (alignment to member 0)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from wsbook import plots

    if spec.widths[0] != 2 or not spec.bias:
        raise ValueError(f"the sphere picture needs 2 inputs and biases (points on S^2); got {spec}")
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "scene"}, {"type": "scene"}]],
                        subplot_titles=["normalized (scaling removed)", "canonical (aligned to network 0)"])
    for col, theta in ((1, normalized), (2, canonical)):
        fig.add_trace(plots.sphere_surface(), row=1, col=col)
        w, b = spec.weights(theta)[0][:members], spec.biases(theta)[0][:members]
        pts = torch.cat([w, b.unsqueeze(2)], 2).cpu().numpy()          # [members, width, 3]
        for k in range(pts.shape[0]):   # one trace per plotted network (a handful), for the legend
            fig.add_trace(go.Scatter3d(x=pts[k, :, 0], y=pts[k, :, 1], z=pts[k, :, 2], mode="markers",
                                       marker=dict(size=4, color=plots.PALETTE[k % len(plots.PALETTE)]),
                                       name=f"network {k}", legendgroup=f"n{k}", showlegend=(col == 1)),
                          row=1, col=col)
    axis = dict(showbackground=False, zeroline=False, range=[-1.1, 1.1])
    for name in ("scene", "scene2"):
        fig.layout[name].update(aspectmode="cube", xaxis=axis, yaxis=axis, zaxis=axis)
    fig.update_layout(height=480, margin=dict(l=0, r=0, t=40, b=0))
    return fig
