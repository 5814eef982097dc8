"""The alignment and canonicalization experiments of chapters 5 and 6, as functions the chapters call: a
comparison of alignment methods by barrier / AUC / runtime (DEEP-ALIGN's protocol), a width sweep,
barriers between variational posteriors, SIREN interpolation paths, canonicalization on the product of
spheres, and the learned aligner against weight matching and Sinkhorn (in distribution, on zoos trained on
shifted digit tasks, and trained on one objective at a time). Each returns plain tensors and numbers; the
trained populations they read come from :mod:`wsbook.experiments.zoos` (the shifted zoos from here).
"""
from __future__ import annotations

import time
from typing import Sequence

import torch
from torch import Tensor

from wsbook import config, data
from wsbook.cache import cached
from wsbook.experiments.zoos import fit_variational_zoo, shape_sdf, train_zoo
from wsbook.graphs.align import LearnedAligner
from wsbook.loop import descend
from wsbook.nets import MLPSpec, NetSpec, accuracy, train_population
from wsbook.symmetry.actions import function_difference
from wsbook.symmetry.canonical import canonicalize, normalize_neurons, sphere_distance
from wsbook.symmetry.lmc import auc, barrier, connectivity, gaussian_interpolation_curve, interpolation_curve
from wsbook.symmetry.matching import (activation_matching, sign_aware_weight_matching, sinkhorn_matching,
                                      variational_matching, weight_matching)

ALIGNMENT_METHODS = ("naive", "weight_matching", "activation_matching", "sinkhorn_l2", "sinkhorn_midpoint",
                     "sinkhorn_random", "wm_sinkhorn")


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def compare_alignments(spec: NetSpec, theta_a: Tensor, theta_b: Tensor, x_fit: Tensor, y_fit: Tensor,
                       x_eval: Tensor, y_eval: Tensor, *, methods: Sequence[str] = ALIGNMENT_METHODS,
                       sinkhorn_steps: int = 100, n_points: int = 25, task: str = "classification",
                       generator: torch.Generator | None = None) -> dict[str, dict]:
    """Align every ``theta_b[i]`` to ``theta_a[i]`` with each method (all pairs in one batch) and measure the
    barrier and AUC of the interpolation loss on ``(x_eval, y_eval)`` and the wall time per pair
    (DEEP-ALIGN's protocol, Navon et al., 2024).

    See chapter 5, "Experiment 1: aligning a zoo of digit classifiers".

    Args:
        spec: the architecture of both populations.
        theta_a: reference networks ``[B, D]``.
        theta_b: networks aligned to them ``[B, D]``.
        x_fit: inputs of the data-based methods (activation matching, Sinkhorn).
        y_fit: targets of the Sinkhorn losses.
        x_eval: inputs of the interpolation curves.
        y_eval: targets of the interpolation curves.
        methods: a subset of :data:`ALIGNMENT_METHODS`.
        sinkhorn_steps: optimisation steps of Sinkhorn re-basin.
        n_points: points on each interpolation segment.
        task: ``"classification"`` or ``"regression"`` (the loss of the interpolation curves).
        generator: random source of weight matching's layer order and Sinkhorn (default: seeded with 0).

    Returns:
        Per method the :func:`wsbook.symmetry.connectivity` result (``barrier``, ``auc``, ``loss``,
        ``lambdas``) with ``seconds_per_pair`` and the ``aligned`` networks.
    """
    unknown = set(methods) - set(ALIGNMENT_METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {ALIGNMENT_METHODS}")
    B = theta_a.shape[0]
    gen = generator if generator is not None else config.generator()
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
    Ainsworth et al., 2023).

    See chapter 5, "Experiment 2: barriers shrink with width".

    Args:
        widths: hidden widths to sweep.
        dataset: a classification data set of :mod:`wsbook.data`.
        depth: number of hidden layers.
        n_pairs: pairs of independently trained networks per width.
        steps: training steps of every network (:func:`wsbook.experiments.zoos.train_zoo`, cached).
        lr: learning rate.
        seed: training seed.

    Returns:
        ``{"widths": [K], "naive" | "weight_matching" | "activation_matching": [K, n_pairs]}`` test barriers.
    """
    ds = data.load(dataset)
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


def variational_barriers(spec: MLPSpec, mean: Tensor, std: Tensor, x: Tensor, y: Tensor, *, n_samples: int = 32,
                         n_points: int = 25, seed: int = 0) -> dict[str, dict]:
    """Marginalized loss along the Wasserstein geodesic between pairs of posteriors (first half against
    second half), naive and after variational matching, and along the mixture path (Rossi et al., 2023).

    See chapter 5, "Experiment 3: variational posteriors".

    Args:
        spec: the architecture.
        mean: posterior means ``[2n, D]`` (e.g. :func:`wsbook.experiments.zoos.fit_variational_zoo`).
        std: posterior standard deviations ``[2n, D]``.
        x: evaluation inputs.
        y: evaluation targets.
        n_samples: weight samples per point of the path.
        n_points: points on each path.
        seed: seeds the weight samples.

    Returns:
        ``{"naive" | "aligned" | "mixture": curve}``, each curve with ``barrier`` and ``auc``.
    """
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


@cached("align/variational_width", version=1)
def variational_width_sweep(widths: Sequence[int], *, dataset: str = "digits", depth: int = 2, n_pairs: int = 2,
                            steps: int = 800, n_samples: int = 16, prior_std: float = 1.0,
                            seed: int = 0) -> dict[str, Tensor]:
    """Marginalized barrier between pairs of mean-field posteriors against hidden width, along the
    Wasserstein geodesic without and with variational matching (Rossi et al., 2023, Fig. 5), cached.

    At every width ``2 * n_pairs`` posteriors are fitted by :func:`wsbook.experiments.zoos.fit_variational_zoo`
    (cached on its own, so a width also used elsewhere is fitted once) and paired first half against second
    half by :func:`variational_barriers` on the test split.

    See chapter 5, "Barriers of variational posteriors against width" (in "Experiment 3").

    Args:
        widths: hidden widths to sweep (every hidden layer has this width).
        dataset: a classification data set of :mod:`wsbook.data`.
        depth: number of hidden layers.
        n_pairs: pairs of posteriors per width.
        steps: optimisation steps of every posterior.
        n_samples: weight samples per point of the path.
        prior_std: standard deviation of the Gaussian weight prior.
        seed: seeds the fits and the weight samples.

    Returns:
        ``{"widths": [K], "naive" | "aligned": [K, n_pairs]}`` barriers (test predictive NLL) and
        ``"end_loss": [K, n_pairs]``, the mean marginalized loss of the two end posteriors of each pair.
    """
    rows = [_variational_pairs(dataset, int(w), depth, n_pairs, steps, n_samples, prior_std, 1.0, seed)
            for w in widths]  # a loop over architectures, not over networks
    return {"widths": torch.tensor([int(w) for w in widths]),
            **{k: torch.stack([r[k] for r in rows]) for k in rows[0]}}


def _variational_pairs(dataset: str, width: int, depth: int, n_pairs: int, steps: int, n_samples: int,
                       prior_std: float, temperature: float, seed: int) -> dict[str, Tensor]:
    """Barriers (naive, aligned) and end losses ``[n_pairs]`` of ``2 * n_pairs`` mean-field posteriors of one
    setting (:func:`variational_width_sweep`, :func:`variational_prior_sweep`)."""
    ds = data.load(dataset)
    spec = MLPSpec((ds.x_train.shape[1],) + (width,) * depth + (ds.n_classes,))
    q = fit_variational_zoo(spec, dataset, 2 * n_pairs, steps=steps, prior_std=prior_std, temperature=temperature,
                            seed=seed)
    vi = variational_barriers(spec, q["mean"], q["std"], ds.x_test, ds.y_test, n_samples=n_samples, seed=seed)
    return {"naive": vi["naive"]["barrier"], "aligned": vi["aligned"]["barrier"],
            "end_loss": vi["naive"]["loss"][:, [0, -1]].mean(1)}


@cached("align/variational_prior", version=1)
def variational_prior_sweep(prior_stds: Sequence[float], temperatures: Sequence[float], *, width: int = 32,
                            dataset: str = "digits", depth: int = 2, n_pairs: int = 2, steps: int = 800,
                            n_samples: int = 16, seed: int = 0) -> dict[str, dict[str, Tensor]]:
    """Marginalized barrier between pairs of mean-field posteriors against the prior's scale (at ``T = 1``) and
    against the posterior's temperature (at prior standard deviation 1), naive and after variational matching
    (Rossi et al., 2023, Figs. 7 and 8), cached. Every setting fits its own ``2 * n_pairs`` posteriors of one
    architecture (:func:`wsbook.experiments.zoos.fit_variational_zoo`), paired as in
    :func:`variational_width_sweep`.

    See chapter 5, "Barriers of variational posteriors against width" (in "Experiment 3").

    Args:
        prior_stds: standard deviations of the Gaussian weight prior to sweep.
        temperatures: temperatures ``T`` of ``p^(1/T)`` to sweep (``T < 1``: cold posteriors).
        width, depth: the hidden layers of the architecture.
        dataset, n_pairs, steps, n_samples, seed: as in :func:`variational_width_sweep`.

    Returns:
        ``{"prior": {...}, "temperature": {...}}``, each with the swept ``"values" [K]`` and ``"naive"``,
        ``"aligned"``, ``"end_loss"`` ``[K, n_pairs]``.
    """
    if min(prior_stds) <= 0 or min(temperatures) <= 0:
        raise ValueError(f"prior_stds and temperatures must be positive; got {prior_stds}, {temperatures}")
    out = {}
    for name, values, setting in (("prior", prior_stds, lambda v: (v, 1.0)),
                                  ("temperature", temperatures, lambda v: (1.0, v))):
        rows = [_variational_pairs(dataset, width, depth, n_pairs, steps, n_samples, *setting(float(v)), seed)
                for v in values]   # a loop over settings, each a batch of posteriors
        out[name] = {"values": torch.tensor([float(v) for v in values]),
                     **{k: torch.stack([r[k] for r in rows]) for k in rows[0]}}
    return out


def inr_paths(spec: MLPSpec, nets: dict[str, Tensor], *, n_grid: int = 32, n_points: int = 25) -> dict[str, dict]:
    """Reconstruction loss along the segment for the four settings of Ballerini (2023): same initialisation,
    different initialisations, different + weight matching, different + activation matching; for odd
    activations also different + sign-aware weight matching (Boufalis et al., 2025).

    See chapter 5, "Experiment 4: implicit neural representations".

    Args:
        spec: the SIREN architecture.
        nets: ``{"a", "same", "diff"}`` from :func:`wsbook.experiments.zoos.fit_inr_pairs`.
        n_grid: side of the shape's sampling grid (as in the fit).
        n_points: points on each segment.
    """
    x, y = shape_sdf(n_grid)
    a = nets["a"]
    gen = config.generator()
    cands = {"same": nets["same"], "diff": nets["diff"],
             "diff_weight_matching": weight_matching(spec, a, nets["diff"], generator=gen).aligned,
             "diff_activation_matching": activation_matching(spec, a, nets["diff"], x).aligned}
    if spec.activation in ("sine", "tanh"):   # odd activations: permutations and sign flips together
        cands["diff_sign_aware"] = sign_aware_weight_matching(spec, a, nets["diff"], generator=gen).aligned
    return {k: connectivity(spec, a, v, x, y, n_points=n_points, task="regression") for k, v in cands.items()}


def _segment_loss(spec: MLPSpec, theta_a: Tensor, theta_b: Tensor, x: Tensor, y: Tensor,
                  gen: torch.Generator) -> Tensor:
    """HYPER-MATCHING's training loss: the mean squared error at one point drawn from each quarter of the
    segment ``[0, 1)`` from ``theta_a`` to ``theta_b`` and at ``theta_b``, averaged (``[B]`` pairs at once)."""
    lam = (torch.arange(4.0) + torch.rand(theta_a.shape[0], 4, generator=gen)) / 4
    lam = torch.cat([lam, torch.ones(theta_a.shape[0], 1)], 1).to(theta_a)          # [B, 5]
    points = theta_a[:, None] + lam[..., None] * (theta_b - theta_a)[:, None]        # [B, 5, D]
    out = spec.forward(points.reshape(-1, spec.n_params), x).reshape(*lam.shape, -1)
    return (out - y[:, 0]).pow(2).mean((1, 2))


@cached("align/hyper_matching", version=2)   # 2: trained through loop.descend
def hyper_matching(spec: MLPSpec, theta_a: Tensor, theta_b: Tensor, *, n_grid: int = 32, steps: int = 500,
                   lr: float = 1e-3, seed: int = 0) -> dict[str, Tensor | float]:
    """HYPER-MATCHING (Ballerini, 2023, sec. 3.3) for pairs of SIRENs of :func:`shape_sdf`: an encoder of
    ``theta_b`` (:class:`wsbook.graphs.inr.INREncoder`) and a hypernetwork decoder output ``theta_b_hat``,
    trained end to end so that the segment from ``theta_a`` to ``theta_b_hat`` fits the shape (the loss of
    :func:`_segment_loss`); one model per pair, as the paper trains it. Beside it, the same objective
    optimised directly over ``theta_b_hat`` from ``theta_b`` (for one pair the encoder's input never changes,
    so the hypernetwork is a reparametrisation of this vector), all pairs at once. Cached.

    See chapter 5, "Experiment 4: implicit neural representations".

    Args:
        spec: the SIREN architecture of the pairs.
        theta_a, theta_b: the pairs ``[B, D]`` (e.g. ``a`` and ``diff`` of
            :func:`wsbook.experiments.zoos.fit_inr_pairs`).
        n_grid: side of the shape's sampling grid (as in the fit).
        steps: Adam steps of each model and of the direct optimisation.
        lr: learning rate (the direct optimisation uses ``lr / 10``: it moves the weights themselves).
        seed: seeds the models and the points on the segment.

    Returns:
        ``{"hyper": [B, D], "direct": [B, D], "hyper_seconds", "direct_seconds"}``.
    """
    from wsbook.graphs.inr import INRAutoencoder

    x, y = shape_sdf(n_grid)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    hyper = []
    for i in range(theta_a.shape[0]):     # one encoder-decoder per pair, as the paper trains it
        a, b = theta_a[i:i + 1], theta_b[i:i + 1]
        with config.seeded(seed + i):
            model = INRAutoencoder(spec)
        with torch.no_grad():             # decoder outputs start at the network's per-parameter scale
            model.theta_scale.copy_(b[0].abs().clamp_min(1e-3))
        model.encoder.gnn.set_normalization(torch.cat([a, b]))     # one scale per layer role, from the pair
        model.encoder.norm = torch.nn.Identity()       # one network: nothing to standardise the latent over
        descend(lambda step, model=model, a=a, b=b: _segment_loss(spec, a, model(b), x, y, gen),
                torch.optim.Adam(model.parameters(), lr=lr), steps, desc=f"hyper-matching, pair {i}")
        with torch.no_grad():
            hyper.append(model(b))
    hyper_seconds = time.perf_counter() - start
    start = time.perf_counter()
    direct = theta_b.clone().requires_grad_(True)
    # pairs are independent: descend backpropagates the summed loss, which trains each on its own
    descend(lambda step: _segment_loss(spec, theta_a, direct, x, y, gen), torch.optim.Adam([direct], lr=lr / 10),
            steps, desc="segment loss from B")
    return {"hyper": torch.cat(hyper), "direct": direct.detach(), "hyper_seconds": hyper_seconds,
            "direct_seconds": time.perf_counter() - start}


def orbit_distances(spec: MLPSpec, theta_a: Tensor, theta_b: Tensor, theta_new: Tensor) -> dict[str, Tensor]:
    """Where a new partner ``theta_new`` of ``theta_a`` lies (``[B]`` each, Euclidean norms of the weights):
    ``"to_a"``, its distance to ``theta_a``; ``"to_b_orbit"``, its distance to the nearest relabelling of
    ``theta_b`` that sign-aware weight matching finds; ``"a_to_b_orbit"``, the same for ``theta_a`` itself. A
    partner that is ``theta_b`` relabelled has ``to_b_orbit`` near zero; one far from ``theta_b``'s orbit is
    another network. See chapter 5, "Experiment 4" (hyper-matching)."""
    gen = config.generator()
    near_new = sign_aware_weight_matching(spec, theta_new, theta_b, generator=gen).aligned
    near_a = sign_aware_weight_matching(spec, theta_a, theta_b, generator=gen).aligned
    return {"to_a": (theta_new - theta_a).norm(dim=1), "to_b_orbit": (theta_new - near_new).norm(dim=1),
            "a_to_b_orbit": (theta_a - near_a).norm(dim=1)}


def canonical_distances(spec: MLPSpec, zoo: Tensor, x: Tensor) -> dict[str, Tensor]:
    """Geodesic distances on the product of spheres from member 0 to the others, after normalization only
    (scaling broken) and after full canonicalization against member 0 (permutations broken too), with the
    functions' changes (relative output difference in regression mode, label agreement in classification
    mode).

    See chapter 5, "Experiment 5: canonicalization".

    Args:
        spec: the architecture.
        zoo: the population ``[B, D]``; member 0 is the reference.
        x: inputs on which the functions are compared.
    """
    ref = zoo[:1]
    normalized = normalize_neurons(spec, zoo)
    canonical = canonicalize(spec, zoo, ref, generator=config.generator())
    exact = canonicalize(spec, zoo, ref, task="regression", generator=config.generator())

    with torch.no_grad():
        same_labels = (spec.forward(canonical, x).argmax(-1) == spec.forward(zoo, x).argmax(-1)).float().mean(1)
    return {"normalized": normalized, "canonical": canonical,
            "distance_normalized": sphere_distance(spec, normalized[:1], normalized[1:]),
            "distance_canonical": sphere_distance(spec, canonical[:1], canonical[1:]),
            "function_change": function_difference(spec, zoo, exact, x), "label_agreement": same_labels}


LEARNED_ALIGNMENT_METHODS = ("naive", "weight_matching", "activation_matching", "sinkhorn", "learned", "wm_sinkhorn",
                             "learned_sinkhorn", "learned_wm")


def compare_learned_alignment(aligner: LearnedAligner, theta_a: Tensor, theta_b: Tensor, x_fit: Tensor,
                              y_fit: Tensor, x_eval: Tensor, y_eval: Tensor, *, sinkhorn_steps: int = 200,
                              methods: Sequence[str] = ("naive", "weight_matching", "sinkhorn", "learned",
                                                        "wm_sinkhorn", "learned_sinkhorn", "learned_wm"),
                              seed: int = 0) -> dict:
    """Align every ``theta_b[i]`` to ``theta_a[i]`` with: nothing (naive), weight matching, activation
    matching (on ``x_fit``), Sinkhorn re-basin (interpolation loss on ``x_fit``), the learned aligner,
    Sinkhorn started from weight matching or from the learned aligner (paper ``001``, tables 1 and 3), and
    weight matching started from the learned aligner (``learned_wm``: coordinate descent from the learned
    permutations only).

    Every method reads the architecture from ``aligner.spec`` through its symmetry spec, so MLPs and CNNs
    (``x_fit`` and ``x_eval`` then images ``[N, C, H, W]``) go through the same code.

    See chapter 6, "Experiment 2: learned alignment", "Out of distribution" and "Convolutional networks".

    Args:
        aligner: a trained :class:`wsbook.graphs.align.LearnedAligner` (of an MLP or a CNN).
        theta_a: reference networks ``[B, D]``.
        theta_b: networks aligned to them ``[B, D]``.
        x_fit: inputs of activation matching and of Sinkhorn's interpolation loss.
        y_fit: targets of Sinkhorn's interpolation loss.
        x_eval: inputs of the test interpolation curves.
        y_eval: targets of the test interpolation curves.
        sinkhorn_steps: optimisation steps of every Sinkhorn run.
        methods: a subset of :data:`LEARNED_ALIGNMENT_METHODS`, reported in the order given.
        seed: seeds weight matching and Sinkhorn.

    Returns:
        Per method the test-loss ``barrier`` and ``auc`` (means over pairs), ``seconds_per_pair`` (wall
        clock of the whole batch divided by the pairs; a refinement includes the method it starts from), the
        mean ``curve`` and the per-pair ``barriers`` (see :func:`paired_difference`).
    """
    unknown = set(methods) - set(LEARNED_ALIGNMENT_METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {LEARNED_ALIGNMENT_METHODS}")
    spec = aligner.spec
    n = spec.check(theta_b).shape[0]
    gen = lambda: torch.Generator().manual_seed(seed)  # noqa: E731

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - start) / n

    def sinkhorn(init=None):
        return timed(lambda: sinkhorn_matching(spec, theta_a, theta_b, x_fit, y_fit, loss="random",
                                               steps=sinkhorn_steps, init=init, generator=gen()))

    aligned, seconds = {"naive": theta_b}, {"naive": 0.0}
    wanted = set(methods)
    if wanted & {"weight_matching", "wm_sinkhorn"}:
        wm, seconds["weight_matching"] = timed(lambda: weight_matching(spec, theta_a, theta_b, generator=gen()))
        aligned["weight_matching"] = wm.aligned
    if "activation_matching" in wanted:
        am, seconds["activation_matching"] = timed(lambda: activation_matching(spec, theta_a, theta_b, x_fit))
        aligned["activation_matching"] = am.aligned
    if "sinkhorn" in wanted:
        sk, seconds["sinkhorn"] = sinkhorn()
        aligned["sinkhorn"] = sk.aligned
    if wanted & {"learned", "learned_sinkhorn", "learned_wm"}:
        (learned_perms, aligned["learned"]), seconds["learned"] = timed(lambda: aligner.align(theta_a, theta_b))
    if "wm_sinkhorn" in wanted:
        wm_sk, t = sinkhorn(wm.perms)
        aligned["wm_sinkhorn"], seconds["wm_sinkhorn"] = wm_sk.aligned, seconds["weight_matching"] + t
    if "learned_sinkhorn" in wanted:
        learned_sk, t = sinkhorn(learned_perms)
        aligned["learned_sinkhorn"], seconds["learned_sinkhorn"] = learned_sk.aligned, seconds["learned"] + t
    if "learned_wm" in wanted:
        learned_wm, t = timed(lambda: weight_matching(spec, theta_a, theta_b, starts=("identity",),
                                                      init=learned_perms))
        aligned["learned_wm"], seconds["learned_wm"] = learned_wm.aligned, seconds["learned"] + t
    out = {}
    for name in methods:
        curve = interpolation_curve(spec, theta_a, aligned[name], x_eval, y_eval)
        per_pair = barrier(curve)
        out[name] = {"barrier": per_pair.mean().item(), "auc": auc(curve).mean().item(),
                     "seconds_per_pair": seconds[name], "curve": curve["loss"].mean(0), "barriers": per_pair}
    return out


def paired_difference(comparison: dict, a: str, b: str,
                      pairs: tuple[Tensor, Tensor] | None = None) -> dict[str, float]:
    """Mean and standard error over pairs of ``barrier(a) - barrier(b)`` for two methods of one
    :func:`compare_learned_alignment` (the same pairs): the noise against which a ratio of mean barriers
    is read. Returns ``{"mean", "se", "pairs"}``.

    Disjoint pairs are independent, and the standard error is that of a mean. Pairs drawn from one set of
    networks (every pair of ``n`` networks, :func:`every_pair`) share networks, so their differences are
    correlated: pass the networks of each pair as ``pairs = (i, j)`` and the standard error is the
    delete-one-network jackknife's (every network left out in turn, with all of its pairs)."""
    d = comparison[a]["barriers"] - comparison[b]["barriers"]
    if d.numel() < 2:
        raise ValueError(f"paired_difference needs at least 2 pairs; got {d.numel()}")
    if pairs is None:
        return {"mean": float(d.mean()), "se": float(d.std() / d.numel() ** 0.5), "pairs": int(d.numel())}
    i, j = (torch.as_tensor(p, device=d.device).long() for p in pairs)
    if i.shape != d.shape or j.shape != d.shape or bool((i == j).any()):
        raise ValueError(f"pairs must be two index tensors of {d.numel()} pairs of distinct networks; got "
                         f"shapes {tuple(i.shape)} and {tuple(j.shape)}")
    n = int(torch.cat([i, j]).max()) + 1
    # per network: the sum and count of the differences of its pairs; leaving it out removes exactly those
    touched = torch.zeros(n, dtype=d.dtype, device=d.device).index_add_(0, i, d).index_add_(0, j, d)
    count = torch.zeros(n, dtype=d.dtype, device=d.device).index_add_(0, i, torch.ones_like(d))
    count = count.index_add_(0, j, torch.ones_like(d))
    used = (count > 0) & (count < d.numel())
    if int(used.sum()) < 2:
        raise ValueError("paired_difference: the jackknife needs at least 2 networks whose removal leaves pairs")
    left_out = (d.sum() - touched[used]) / (d.numel() - count[used])
    k = left_out.numel()
    se = ((k - 1) / k * ((left_out - left_out.mean()) ** 2).sum()).sqrt()
    return {"mean": float(d.mean()), "se": float(se), "pairs": int(d.numel())}


def difference_verdict(diff: dict[str, float], than: str = "weight matching", digits: int = 3) -> str:
    """A :func:`paired_difference` of barriers in words, as the chapters state it: ``"below weight matching
    by 0.003 ± 0.002 per pair (mean ± standard error over 8128 pairs), within two standard errors"`` (or
    ``above``, ``beyond two standard errors``; ``level with`` for a difference of exactly zero)."""
    mean, se = diff["mean"], diff["se"]
    side = "below" if mean < 0 else "above" if mean > 0 else "level with"
    noise = "beyond" if abs(mean) > 2 * se else "within"
    return (f"{side} {than} by {abs(mean):.{digits}f} ± {se:.{digits}f} per pair (mean ± standard error over "
            f"{diff['pairs']} pairs), {noise} two standard errors")


def every_pair(n: int) -> tuple[Tensor, Tensor]:
    """The ``n (n - 1) / 2`` pairs ``(i, j)``, ``i < j``, of ``n`` networks, as two index tensors (for
    :func:`compare_learned_alignment` on ``theta[i], theta[j]`` and :func:`paired_difference`)."""
    if n < 2:
        raise ValueError(f"every_pair needs at least 2 networks; got {n}")
    i, j = torch.triu_indices(n, n, 1)
    return i, j


ALIGNER_OBJECTIVES = {"supervised": (1.0, 0.0), "interpolation": (0.0, 1.0), "both": (1.0, 1.0)}


@cached("align/objectives", version=1)
def aligner_objectives(spec: NetSpec, fit_nets: Tensor, theta_a: Tensor, theta_b: Tensor, x_fit: Tensor,
                       y_fit: Tensor, x_eval: Tensor, y_eval: Tensor, *,
                       objectives: Sequence[str] = ("supervised", "interpolation"), dim: int = 16,
                       n_layers: int = 2, layer: str = "relational_transformer", init_seed: int = 0,
                       steps: int = 300, batch_size: int = 8, lr: float = 3e-3,
                       noise: float | tuple[float, float] = (0.0, 0.8), planted_noise: float = 0.02,
                       seed: int = 0) -> dict[str, dict[str, float]]:
    """The objectives ablation of paper ``001`` (Table 6): one learned aligner per objective of
    :data:`ALIGNER_OBJECTIVES` (``(supervised_weight, lmc_weight)`` of :func:`wsbook.graphs.align.fit_aligner`),
    each built with torch seeded to ``init_seed`` and trained on the same pairs, copies and batches; then
    scored on independently trained pairs and on planted permutations, cached.

    See chapter 6, "Which training signal matters" (in "Experiment 2: learned alignment").

    Args:
        spec: the architecture of the zoo.
        fit_nets: the training zoo ``[M, D]`` (also sets the aligner's input normalization).
        theta_a: reference networks of the test pairs ``[B, D]``.
        theta_b: networks aligned to them ``[B, D]``.
        x_fit: inputs of the interpolation loss.
        y_fit: targets of the interpolation loss.
        x_eval: inputs of the test interpolation curves.
        y_eval: targets of the test interpolation curves.
        objectives: names in :data:`ALIGNER_OBJECTIVES`.
        dim, n_layers, layer: the :class:`wsbook.graphs.align.LearnedAligner`.
        init_seed: torch's seed while the aligner is built.
        steps, batch_size, lr, noise, seed: passed to :func:`wsbook.graphs.align.fit_aligner`.
        planted_noise: std of the noise of the planted copies of ``theta_a`` the recovery is measured on.

    Returns:
        Per objective the test ``barrier`` and ``auc`` after learned alignment (means over pairs), the
        fraction of planted neuron assignments recovered (``recovery``) and the mean of the last tenth of
        each training loss (``final_supervised``, ``final_interpolation``; ``nan`` for a loss not trained).
    """
    from wsbook import symmetry
    from wsbook.graphs.align import fit_aligner, planted_recovery

    unknown = set(objectives) - set(ALIGNER_OBJECTIVES)
    if unknown or not objectives:
        raise ValueError(f"objectives must be a non-empty subset of {tuple(ALIGNER_OBJECTIVES)}; got {objectives}")
    gen = torch.Generator().manual_seed(seed + 1)
    g = symmetry.random_permutation(spec, theta_a.shape[0], gen)
    noisy = theta_a + planted_noise * torch.randn(theta_a.shape, generator=gen).to(theta_a)
    planted = symmetry.permute(spec, noisy, g)
    out = {}
    for name in objectives:
        supervised_weight, lmc_weight = ALIGNER_OBJECTIVES[name]
        with config.seeded(init_seed):
            aligner = LearnedAligner(spec, dim=dim, n_layers=n_layers, layer=layer).to(fit_nets.device)
        history = fit_aligner(aligner, fit_nets, x_fit, y_fit, steps=steps, batch_size=batch_size, lr=lr, noise=noise,
                              supervised_weight=supervised_weight, lmc_weight=lmc_weight, seed=seed)
        _, aligned = aligner.align(theta_a, theta_b)
        curve = interpolation_curve(spec, theta_a, aligned, x_eval, y_eval)
        tail = history[-max(1, steps // 10):].mean(0)
        out[name] = {"barrier": barrier(curve).mean().item(), "auc": auc(curve).mean().item(),
                     "recovery": planted_recovery(aligner, theta_a, planted, symmetry.inverse_permutation(g)),
                     "final_supervised": tail[0].item(), "final_interpolation": tail[1].item()}
    return out


SHIFTED_DIGITS = ("rotated", "mnist")
MAX_ROTATION_DEGREES = 45.0   # the rotated digits turn by an angle drawn uniformly from +- this


def shifted_digits(shift: str, pool: int = 2, seed: int = 0) -> dict[str, Tensor]:
    """A classification task with the inputs and classes of the pooled digits (``(8 / pool)^2`` pixels, ten
    digits) but another distribution, for aligners trained on a digits zoo (paper ``001``, Table 3). Built
    from packaged data only:

    * ``"rotated"``: every 8x8 digit image turned by its own angle drawn uniformly from
      ``-MAX_ROTATION_DEGREES`` to ``MAX_ROTATION_DEGREES`` (45) degrees
      (bilinear, the border pixel repeated outside the image), then pooled; the analogue of the paper's
      rotated CIFAR10.
    * ``"mnist"``: the 5,000-image MNIST subset of :mod:`wsbook.data` (28x28 digits of another source),
      average-pooled to the same ``(8 / pool)^2`` pixels; the analogue of the paper's STL10.

    See chapter 6, "Out of distribution" (in "Experiment 2: learned alignment").

    Args:
        shift: one of :data:`SHIFTED_DIGITS`.
        pool: the pooling of the digits the aligner was trained on (1, 2, 4 or 8).
        seed: seeds the rotation angles.

    Returns:
        ``x_train``, ``y_train``, ``x_test``, ``y_test`` (the data sets' own splits; inputs standardized as
        :func:`wsbook.data.load` does, before pooling).
    """
    from wsbook.experiments.zoos import pooled_digits

    if shift not in SHIFTED_DIGITS:
        raise ValueError(f"unknown shift {shift!r}; choose from {SHIFTED_DIGITS}")
    if pool not in (1, 2, 4, 8):
        raise ValueError(f"pool must be 1, 2, 4 or 8; got {pool}")
    if shift == "mnist":
        ds = data.load("mnist5k")
        side = 8 // pool

        def prepare(x: Tensor) -> Tensor:
            return torch.nn.functional.adaptive_avg_pool2d(x.view(-1, 1, 28, 28), side).flatten(1)

        return {"x_train": prepare(ds.x_train), "y_train": ds.y_train, "x_test": prepare(ds.x_test),
                "y_test": ds.y_test}
    ds = data.load("digits")
    gen = torch.Generator().manual_seed(seed)

    def rotate(x: Tensor) -> Tensor:
        angle = ((2 * torch.rand(x.shape[0], generator=gen) - 1) * MAX_ROTATION_DEGREES).deg2rad().to(x)
        cos, sin, zero = angle.cos(), angle.sin(), torch.zeros_like(angle)
        affine = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
        grid = torch.nn.functional.affine_grid(affine, [x.shape[0], 1, 8, 8], align_corners=False)
        turned = torch.nn.functional.grid_sample(x.view(-1, 1, 8, 8), grid, padding_mode="border",
                                                 align_corners=False)
        return pooled_digits(turned.flatten(1), pool)

    return {"x_train": rotate(ds.x_train), "y_train": ds.y_train, "x_test": rotate(ds.x_test),
            "y_test": ds.y_test}


@cached("align/shifted_zoo", version=1)
def shifted_digits_zoo(shift: str, n_nets: int, *, hidden: int = 16, depth: int = 2, steps: int = 300,
                       lr: float = 3e-3, pool: int = 2, seed: int = 1) -> dict[str, Tensor]:
    """``n_nets`` ReLU classifiers ``(8 / pool)^2 -> hidden x depth -> 10`` trained on
    :func:`shifted_digits` ``(shift, pool)`` from independent initialisations (Adam, minibatches of 32, as
    :func:`wsbook.experiments.zoos.digits_zoo` trains the in-distribution zoo), cached.

    See chapter 6, "Out of distribution" (in "Experiment 2: learned alignment").

    Args:
        shift: one of :data:`SHIFTED_DIGITS`.
        n_nets: networks to train.
        hidden: hidden width.
        depth: number of hidden layers.
        steps: training steps of every network.
        lr: Adam learning rate.
        pool: pooling of the inputs.
        seed: seeds initialisations and minibatch orders (pick one the in-distribution zoo did not use).

    Returns:
        ``theta [n_nets, D]`` and ``test_accuracy [n_nets]``.
    """
    task = shifted_digits(shift, pool)
    spec = MLPSpec((task["x_train"].shape[1],) + (hidden,) * depth + (10,))
    gen = torch.Generator().manual_seed(seed)
    theta0 = spec.init(n_nets, generator=gen)
    theta = train_population(spec, theta0, task["x_train"], task["y_train"], steps=steps, lr=lr, batch_size=32,
                             generator=gen, desc=f"{shift} zoo").theta.detach()
    return {"theta": theta, "test_accuracy": accuracy(spec, theta, task["x_test"], task["y_test"])}


def merge_canonical_forms(autoencoder, theta_a: Tensor, theta_b: Tensor, images: Tensor, *,
                          n_points: int = 21, seed: int = 0) -> dict[str, dict]:
    """Merge two *independently* fitted SIRENs of the same image along the linear path between: the networks
    as fitted (naive), ``theta_b`` after sign-aware weight matching to ``theta_a``, and the two canonical
    forms the autoencoder decodes (Boufalis et al., 2025, paper ``004``). Unlike two members of one orbit,
    two independent fits have different codes, so a flat canonical path is not guaranteed by construction.

    See chapter 6, "Merging independently fitted networks".

    Args:
        autoencoder: a trained :class:`wsbook.graphs.inr.INRAutoencoder` (its ``spec`` is the SIRENs').
        theta_a: SIRENs fitted from one initialisation ``[B, D]``.
        theta_b: SIRENs of the same images fitted from another ``[B, D]``.
        images: the image of each pair ``[B, 64]`` (pixels of an 8x8 grid).
        n_points: points on each path, both ends included.
        seed: seeds weight matching.

    Returns:
        Per method (``naive``, ``weight_matching``, ``autoencoder``) the pixel-MSE ``loss [B, n_points]``,
        ``barrier [B]``, the mean MSE along the path ``mean_loss [B]`` and the largest ``max_loss [B]``.
    """
    from wsbook.graphs.inr import pixel_grid

    spec = autoencoder.spec
    a, b = spec.check(theta_a, "theta_a"), spec.check(theta_b, "theta_b")
    if a.shape != b.shape or images.shape != (a.shape[0], 64):
        raise ValueError(f"need theta_a, theta_b [B, {spec.n_params}] and images [B, 64]; got "
                         f"{tuple(a.shape)}, {tuple(b.shape)} and {tuple(images.shape)}")
    matched = sign_aware_weight_matching(spec, a, b, generator=torch.Generator().manual_seed(seed)).aligned
    autoencoder.eval()
    with torch.no_grad():
        ca, cb = autoencoder(a), autoencoder(b)
    pixels, targets = pixel_grid(8, a.device), images.unsqueeze(-1)
    out = {}
    for name, (u, v) in {"naive": (a, b), "weight_matching": (a, matched), "autoencoder": (ca, cb)}.items():
        loss = interpolation_curve(spec, u, v, pixels, targets, n_points=n_points, task="regression")["loss"]
        out[name] = {"loss": loss, "barrier": barrier(loss), "mean_loss": loss.mean(1), "max_loss": loss.amax(1)}
    return out
