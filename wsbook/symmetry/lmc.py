"""Linear mode connectivity: loss and accuracy along the segment between two networks, the loss barrier
and the area under the excess-loss curve (Frankle et al., 2020; Entezari et al., 2022; Ainsworth et al.,
2023), and the marginalized barrier between two mean-field Gaussian posteriors along the Wasserstein
geodesic and along the mixture path (Rossi et al., 2023). This is the library's one implementation of
interpolation curves and barriers (chapters 5 and 6 use it). See chapter 5, "Linear mode connectivity".
"""
from __future__ import annotations

import torch
from torch import Tensor

from wsbook.nets import NetSpec, check_task, output_loss


def _lambdas(n_points: int, like: Tensor) -> Tensor:
    if n_points < 2:
        raise ValueError(f"n_points must be at least 2; got {n_points}")
    return torch.linspace(0, 1, n_points, dtype=like.dtype, device=like.device)


def _pair(spec: NetSpec, a: Tensor, b: Tensor, names=("theta_a", "theta_b")) -> tuple[Tensor, Tensor]:
    a, b = spec.check(a, names[0]), spec.check(b, names[1])
    if a.shape[0] != b.shape[0] and 1 not in (a.shape[0], b.shape[0]):
        raise ValueError(f"{names[0]} has {a.shape[0]} networks and {names[1]} has {b.shape[0]}; need equal or 1")
    B = max(a.shape[0], b.shape[0])
    return a.expand(B, -1), b.to(a).expand(B, -1)


def interpolation_curve(spec: NetSpec, theta_a: Tensor, theta_b: Tensor, x: Tensor, y: Tensor, *,
                        n_points: int = 25, task: str = "classification", chunk: int = 4096) -> dict[str, Tensor]:
    """Loss (and accuracy) of ``(1 - lam) theta_a + lam theta_b`` at ``n_points`` evenly spaced ``lam``
    for every pair at once: ``{"lambdas": [T], "loss": [B, T], "accuracy": [B, T]}`` (accuracy for
    classification only).

    Args:
        spec: the architecture.
        theta_a, theta_b: the end points ``[B, D]`` (or ``[1, D]``, broadcast).
        x: inputs ``[N, ...]`` shared by all pairs.
        y: targets shared by all pairs (labels ``[N]``, values ``[N]`` / ``[N, out]``) or one set per pair
            (labels ``[B, N]``, values ``[B, N, out]``), e.g. the image each pair of INRs encodes.
        n_points: number of ``lam`` values, including both ends.
        task: ``"classification"`` (cross-entropy) or ``"regression"`` (mean squared error).
        chunk: networks per batched forward pass.
    """
    check_task(task)
    a, b = _pair(spec, theta_a, theta_b)
    lam = _lambdas(n_points, a)
    B, T = a.shape[0], n_points
    per_pair = y.dim() == (2 if task == "classification" else 3)
    if per_pair and y.shape[0] != B:
        raise ValueError(f"per-pair targets must have one entry per pair ({B}); got y of shape {tuple(y.shape)}")
    path = ((1 - lam)[:, None, None] * a + lam[:, None, None] * b).reshape(T * B, -1)    # [T*B, D], lam-major
    losses, accs = [], []
    with torch.no_grad():
        for s in range(0, T * B, chunk):
            rows = torch.arange(s, min(s + chunk, T * B), device=y.device)
            yb = y[rows % B] if per_pair else y
            out = spec.forward(path[s:s + chunk], x)
            losses.append(output_loss(out, yb, task))
            if task == "classification":
                accs.append((out.argmax(-1) == yb).float().mean(-1))
    result = {"lambdas": lam, "loss": torch.cat(losses).view(T, B).T}
    if accs:
        result["accuracy"] = torch.cat(accs).view(T, B).T
    return result


def _excess(losses: Tensor, lambdas: Tensor | None) -> tuple[Tensor, Tensor]:
    if isinstance(losses, dict):
        losses, lambdas = losses["loss"], losses["lambdas"]
    if losses.dim() == 1:
        losses = losses.unsqueeze(0)
    T = losses.shape[1]
    lam = torch.linspace(0, 1, T, dtype=losses.dtype, device=losses.device) if lambdas is None else lambdas.to(losses)
    if lam.shape != (T,):
        raise ValueError(f"lambdas must be [{T}]; got {tuple(lam.shape)}")
    linear = (1 - lam) * losses[:, :1] + lam * losses[:, -1:]
    return losses - linear, lam


def barrier(losses: Tensor | dict, lambdas: Tensor | None = None) -> Tensor:
    """Loss barrier ``max_lam [L(lam) - ((1 - lam) L(0) + lam L(1))]`` per pair, from a curve ``[B, T]`` (or the
    dict returned by :func:`interpolation_curve`)."""
    excess, _ = _excess(losses, lambdas)
    return excess.amax(1)


def auc(losses: Tensor | dict, lambdas: Tensor | None = None) -> Tensor:
    """Area under the excess-loss curve ``int_0^1 [L(lam) - linear(lam)] dlam`` (trapezoid rule) per pair."""
    excess, lam = _excess(losses, lambdas)
    return torch.trapezoid(excess, lam, dim=1)


def connectivity(spec: NetSpec, theta_a: Tensor, theta_b: Tensor, x: Tensor, y: Tensor, *, n_points: int = 25,
                 task: str = "classification") -> dict[str, Tensor]:
    """The interpolation curve of every pair (:func:`interpolation_curve`, same arguments) together with its
    ``barrier`` and ``auc`` (each ``[B]``)."""
    curve = interpolation_curve(spec, theta_a, theta_b, x, y, n_points=n_points, task=task)
    return {**curve, "barrier": barrier(curve), "auc": auc(curve)}


def gaussian_interpolation_curve(spec: NetSpec, mean_a: Tensor, std_a: Tensor, mean_b: Tensor, std_b: Tensor,
                                 x: Tensor, y: Tensor, *, path: str = "wasserstein", n_points: int = 25,
                                 n_samples: int = 32, generator: torch.Generator | None = None,
                                 chunk: int = 2048) -> dict[str, Tensor]:
    """Marginalized loss ``-mean_n log E_{q_t}[p(y_n | x_n, theta)]`` along a path of mean-field Gaussians
    (Rossi et al., 2023), for classifiers. ``wasserstein``: the 2-Wasserstein geodesic
    ``q_t = N((1-t) mu_a + t mu_b, ((1-t) sigma_a + t sigma_b)^2)`` with common random numbers along the path;
    ``mixture``: ``q_t = (1-t) q_a + t q_b``, whose predictive is the mixture of the end predictives.
    Returns ``{"lambdas": [T], "loss": [B, T], "accuracy": [B, T]}`` (accuracy of the predictive mean).

    Args:
        spec: the architecture (a classifier).
        mean_a, std_a, mean_b, std_b: the end-point Gaussians ``[B, D]`` (or ``[1, D]``).
        x, y: inputs and class labels.
        path: ``"wasserstein"`` or ``"mixture"``.
        n_points: number of points ``t`` including both ends.
        n_samples: Monte Carlo samples per point (common random numbers along the path).
        generator: randomness of the samples (``None``: torch's global generator).
        chunk: networks per batched forward pass.
    """
    if path not in ("wasserstein", "mixture"):
        raise ValueError(f"path must be 'wasserstein' or 'mixture'; got {path!r}")
    ma, mb = _pair(spec, mean_a, mean_b, ("mean_a", "mean_b"))
    sa, sb = _pair(spec, std_a, std_b, ("std_a", "std_b"))
    if sa.shape != ma.shape:
        raise ValueError(f"std_a has shape {tuple(sa.shape)} but mean_a has {tuple(ma.shape)}")
    B, D = ma.shape
    lam = _lambdas(n_points, ma)
    eps = torch.randn(n_samples, B, D, generator=generator).to(ma)     # None: torch's global generator

    def predictive(means: Tensor, stds: Tensor) -> Tensor:           # [K, B, D] -> [K, B, N, C]
        K = means.shape[0]
        thetas = (means.unsqueeze(1) + stds.unsqueeze(1) * eps.unsqueeze(0)).reshape(-1, D)
        with torch.no_grad():
            probs = torch.cat([torch.softmax(spec.forward(thetas[s:s + chunk], x), -1)
                               for s in range(0, thetas.shape[0], chunk)])
        return probs.view(K, n_samples, B, x.shape[0], -1).mean(1)

    if path == "wasserstein":
        l = lam[:, None, None]
        probs = torch.cat([predictive((1 - l[i:i + 4]) * ma + l[i:i + 4] * mb, (1 - l[i:i + 4]) * sa + l[i:i + 4] * sb)
                           for i in range(0, n_points, 4)])
    else:
        ends = predictive(torch.stack([ma, mb]), torch.stack([sa, sb]))
        probs = (1 - lam)[:, None, None, None] * ends[0] + lam[:, None, None, None] * ends[1]
    nll = -torch.log(probs.gather(-1, y.view(1, 1, -1, 1).expand(n_points, B, -1, 1)).squeeze(-1).clamp_min(1e-12))
    return {"lambdas": lam, "loss": nll.mean(-1).T, "accuracy": (probs.argmax(-1) == y).float().mean(-1).T}
