"""Alignment of networks up to permutation (and sign) symmetry: weight matching, activation matching,
Sinkhorn re-basin, sign-aware weight matching and variational (mean-field Gaussian) matching.

Every function aligns a population ``theta [B, D]`` to a reference ``theta_ref`` (``[D]``, ``[1, D]`` or
``[B, D]``, one reference per member) and returns the group element (see :mod:`wsbook.symmetry.actions`)
and the aligned population. Cost matrices for the whole population are built with batched products;
the only per-network loop is the Hungarian solve itself (``scipy.optimize.linear_sum_assignment`` has no
batched form), which runs on ``[width, width]`` matrices already computed.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from wsbook.nets import MLPSpec, per_member_loss
from wsbook.symmetry.actions import flip_signs, permute, permute_soft
from wsbook.symmetry.spec import symmetry_spec


# ------------------------------------------------------------------ helpers
def hungarian(cost: Tensor, maximize: bool = True) -> Tensor:
    """Solve ``[B, n, n]`` linear assignment problems; returns ``perm [B, n]`` with row ``i`` assigned to
    column ``perm[i]`` (the Hungarian method / Jonker-Volgenant via SciPy, one call per matrix)."""
    if cost.dim() == 2:
        cost = cost.unsqueeze(0)
    if cost.dim() != 3 or cost.shape[1] != cost.shape[2]:
        raise ValueError(f"cost must be [B, n, n]; got {tuple(cost.shape)}")
    c = cost.detach().to("cpu", torch.float64).numpy()
    if not np.isfinite(c).all():
        raise FloatingPointError("assignment cost contains NaN or inf")
    out = np.empty(c.shape[:2], dtype=np.int64)

    def solve(b: int) -> None:
        out[b] = linear_sum_assignment(c[b], maximize=maximize)[1]

    # no batched LAP solver exists in SciPy, so this is the one per-network loop; SciPy releases the GIL
    # inside the solver, so large batches are spread over the torch CPU threads
    workers = min(torch.get_num_threads(), c.shape[0] // 8)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(solve, range(c.shape[0])))
    else:
        for b in range(c.shape[0]):
            solve(b)
    return torch.from_numpy(out).to(cost.device)


def _pair(spec: MLPSpec, theta_ref: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
    """Validate a reference and a population for alignment and broadcast the reference."""
    ref = spec.check(theta_ref, "theta_ref")
    theta = spec.check(theta, "theta")
    if ref.shape[0] not in (1, theta.shape[0]):
        raise ValueError(f"theta_ref must be one network ([D] or [1, D]) or one per member ([{theta.shape[0]}, D]); "
                         f"got {ref.shape[0]} references for {theta.shape[0]} networks")
    return ref.to(theta), theta


def _check_spec(spec: MLPSpec) -> None:
    if not isinstance(spec, MLPSpec):
        raise TypeError(f"spec must be an MLPSpec; got {type(spec).__name__}")
    if spec.n_layers < 2:
        raise ValueError(f"{spec} has no hidden layer, so there is nothing to align")


def _wm_core(spec: MLPSpec, refs: list[Tensor], others: list[Tensor], *, signs: bool, max_iter: int,
             generator: torch.Generator | None, init: list[Tensor] | None) -> tuple[list[Tensor], list[Tensor], dict]:
    """Coordinate descent of Ainsworth et al. (2023, Alg. 1) summed over parameter 'channels' (e.g. means and
    standard deviations). Layers are visited in a fresh random order each sweep; a member stops when a full
    sweep changes none of its permutations; at most ``max_iter`` sweeps."""
    B = others[0].shape[0]
    groups = symmetry_spec(spec).groups
    dev = others[0].device
    wr = [spec.weights(r) for r in refs]
    br = [spec.biases(r) for r in refs]
    wo = [spec.weights(t) for t in others]
    bo = [spec.biases(t) for t in others]
    perms = [p.clone().long().to(dev).expand(B, -1).clone() for p in init] if init is not None else \
        [torch.arange(g.width, device=dev).expand(B, g.width).clone() for g in groups]
    sgn = [torch.ones(B, g.width, device=dev, dtype=others[0].dtype) for g in groups]
    active = torch.ones(B, dtype=torch.bool, device=dev)
    sweeps, lap_seconds = 0, 0.0
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    while sweeps < max_iter and bool(active.any()):
        sweeps += 1
        changed = torch.zeros(B, dtype=torch.bool, device=dev)
        for h in torch.randperm(len(groups), generator=gen).tolist():
            idx = active.nonzero().flatten()
            cost = 0.0
            for c in range(len(refs)):
                w_in = wo[c][h][idx]                                      # [b, w, in]
                if h > 0:  # columns follow the previous layer's current element
                    p = perms[h - 1][idx]
                    w_in = w_in.gather(2, p.unsqueeze(1).expand(-1, w_in.shape[1], -1)) * sgn[h - 1][idx].unsqueeze(1)
                ref_in = wr[c][h] if wr[c][h].shape[0] == 1 else wr[c][h][idx]
                cost = cost + ref_in @ w_in.transpose(1, 2)
                if spec.bias:
                    b_ref = br[c][h] if br[c][h].shape[0] == 1 else br[c][h][idx]
                    cost = cost + b_ref.unsqueeze(2) * bo[c][h][idx].unsqueeze(1)
                w_out = wo[c][h + 1][idx]                                 # [b, out, w]
                if h + 1 < len(groups):  # rows follow the next layer's current element
                    p = perms[h + 1][idx]
                    w_out = w_out.gather(1, p.unsqueeze(2).expand(-1, -1, w_out.shape[2])) * sgn[h + 1][idx].unsqueeze(2)
                ref_out = wr[c][h + 1] if wr[c][h + 1].shape[0] == 1 else wr[c][h + 1][idx]
                cost = cost + ref_out.transpose(1, 2) @ w_out
            t0 = time.perf_counter()
            new = hungarian(cost.abs() if signs else cost)
            lap_seconds += time.perf_counter() - t0
            if signs:
                picked = cost.gather(2, new.unsqueeze(2)).squeeze(2)
                sgn[h][idx] = torch.where(picked < 0, -1.0, 1.0).to(sgn[h])
            changed[idx] |= (new != perms[h][idx]).any(1)
            perms[h][idx] = new
        active &= changed
    return perms, sgn, {"sweeps": sweeps, "converged": not bool(active.any()), "hungarian_seconds": lap_seconds}


# --------------------------------------------------------- weight matching
def weight_matching(spec: MLPSpec, theta_ref: Tensor, theta: Tensor, *, max_iter: int = 100,
                    generator: torch.Generator | None = None, init: list[Tensor] | None = None,
                    return_info: bool = False):
    """Weight matching (Ainsworth et al., 2023): find ``pi`` maximising ``sum_l <W_l^ref, P_l W_l P_{l-1}^T>
    + <b_l^ref, P_l b_l>`` by coordinate descent over layers with the Hungarian method.

    Aligns a whole zoo ``theta [B, D]`` to one reference ``[D]`` / ``[1, D]`` (or one reference per member)
    in a batch. Convergence: a member stops when a full sweep over the layers (random order) changes
    none of its permutations; at most ``max_iter`` sweeps. Returns ``(perms, aligned)`` (and a dict with
    the number of sweeps, convergence and the seconds spent in Hungarian solves when ``return_info``).
    """
    _check_spec(spec)
    ref, theta = _pair(spec, theta_ref, theta)
    perms, _, info = _wm_core(spec, [ref], [theta], signs=False, max_iter=max_iter, generator=generator, init=init)
    aligned = permute(spec, theta, perms)
    return (perms, aligned, info) if return_info else (perms, aligned)


def sign_aware_weight_matching(spec: MLPSpec, theta_ref: Tensor, theta: Tensor, *, max_iter: int = 100,
                               generator: torch.Generator | None = None, return_info: bool = False):
    """Weight matching over permutations *and* sign flips, for odd activations (tanh, sine): the Hungarian
    method on ``|C|`` picks the permutation and ``sign(C[i, perm[i]])`` the flip (Boufalis et al., 2025).

    Returns ``(perms, signs, aligned)`` with ``aligned = flip_signs(permute(theta, perms), signs)``.
    """
    _check_spec(spec)
    if symmetry_spec(spec).scaling != "sign":
        raise ValueError(f"sign-aware matching needs an odd activation (tanh, sine); {spec} uses {spec.activation}")
    ref, theta = _pair(spec, theta_ref, theta)
    perms, signs, info = _wm_core(spec, [ref], [theta], signs=True, max_iter=max_iter, generator=generator, init=None)
    aligned = flip_signs(spec, permute(spec, theta, perms), signs)
    return (perms, signs, aligned, info) if return_info else (perms, signs, aligned)


def variational_matching(spec: MLPSpec, mean_ref: Tensor, std_ref: Tensor, mean: Tensor, std: Tensor, *,
                         max_iter: int = 100, generator: torch.Generator | None = None):
    """Align mean-field Gaussians ``N(mean, diag(std^2))`` (Rossi et al., 2023): minimise the squared
    2-Wasserstein distance ``||mu_ref - P mu||^2 + ||sigma_ref - P sigma||^2`` over permutations, i.e. weight
    matching on means and standard deviations together. Returns ``(perms, mean_aligned, std_aligned)``."""
    _check_spec(spec)
    mref, mean = _pair(spec, mean_ref, mean)
    sref, std = _pair(spec, std_ref, std)
    if std.shape != mean.shape:
        raise ValueError(f"mean and std must have the same shape; got {tuple(mean.shape)} and {tuple(std.shape)}")
    if bool((std < 0).any()) or bool((std_ref < 0).any()):
        raise ValueError("standard deviations must be non-negative")
    perms, _, _ = _wm_core(spec, [mref, sref], [mean, std], signs=False, max_iter=max_iter, generator=generator,
                           init=None)
    return perms, permute(spec, mean, perms), permute(spec, std, perms)


# ----------------------------------------------------- activation matching
def activation_statistics(spec: MLPSpec, theta_ref: Tensor, theta: Tensor, x: Tensor, *,
                          batch_size: int = 512, statistic: str = "correlation") -> list[Tensor]:
    """Per hidden layer, the ``[B, w, w]`` similarity of reference neuron ``i`` and neuron ``j`` of each member,
    from post-activations streamed over data batches: ``inner`` = mean of ``h_ref_i h_j``, ``correlation`` =
    Pearson correlation (Li et al., 2016; Ainsworth et al., 2023)."""
    if statistic not in ("inner", "correlation"):
        raise ValueError(f"statistic must be 'inner' or 'correlation'; got {statistic!r}")
    ref, theta = _pair(spec, theta_ref, theta)
    if x.dim() != 2 or x.shape[1] != spec.widths[0]:
        raise ValueError(f"x must be [N, {spec.widths[0]}]; got {tuple(x.shape)}")
    L, n = spec.n_layers - 1, x.shape[0]
    cross = [0.0] * L
    s_ref, s, q_ref, q = [0.0] * L, [0.0] * L, [0.0] * L, [0.0] * L
    with torch.no_grad():
        for start in range(0, n, batch_size):
            xb = x[start:start + batch_size].to(theta)
            _, h_ref = spec.forward(ref, xb, return_hidden=True)
            _, h = spec.forward(theta, xb, return_hidden=True)
            for l in range(L):
                cross[l] = cross[l] + h_ref[l].transpose(1, 2) @ h[l]
                s_ref[l] = s_ref[l] + h_ref[l].sum(1)
                s[l] = s[l] + h[l].sum(1)
                q_ref[l] = q_ref[l] + (h_ref[l] ** 2).sum(1)
                q[l] = q[l] + (h[l] ** 2).sum(1)
    out = []
    for l in range(L):
        if statistic == "inner":
            out.append(cross[l] / n)
            continue
        m_ref, m = s_ref[l] / n, s[l] / n
        cov = cross[l] / n - m_ref.unsqueeze(2) * m.unsqueeze(1)
        sd_ref = (q_ref[l] / n - m_ref ** 2).clamp_min(0).sqrt()
        sd = (q[l] / n - m ** 2).clamp_min(0).sqrt()
        out.append(cov / (sd_ref.unsqueeze(2) * sd.unsqueeze(1)).clamp_min(1e-8))
    return out


def activation_matching(spec: MLPSpec, theta_ref: Tensor, theta: Tensor, x: Tensor, *, batch_size: int = 512,
                        statistic: str = "correlation", signs: bool = False):
    """Activation matching (Ainsworth et al., 2023): match each hidden layer's neurons by the similarity of
    their post-activations on data (one Hungarian problem per layer; layers are independent because
    a network's hidden activations are a function of the network alone, only their order changes).

    With ``signs`` (tanh, sine) the Hungarian method runs on ``|C|`` and the sign of the matched entry gives
    the flip. Returns ``(perms, aligned)``, or ``(perms, signs, aligned)`` with ``signs``.
    """
    _check_spec(spec)
    if signs and symmetry_spec(spec).scaling != "sign":
        raise ValueError(f"signs=True needs an odd activation (tanh, sine); {spec} uses {spec.activation}")
    ref, theta = _pair(spec, theta_ref, theta)
    stats = activation_statistics(spec, ref, theta, x, batch_size=batch_size, statistic=statistic)
    perms = [hungarian(c.abs() if signs else c) for c in stats]
    aligned = permute(spec, theta, perms)
    if not signs:
        return perms, aligned
    flips = [torch.where(c.gather(2, p.unsqueeze(2)).squeeze(2) < 0, -1.0, 1.0).to(theta) for c, p in zip(stats, perms)]
    return perms, flips, flip_signs(spec, aligned, flips)


# -------------------------------------------------------- Sinkhorn re-basin
def sinkhorn(log_alpha: Tensor, n_iter: int = 20) -> Tensor:
    """Log-domain Sinkhorn normalisation of ``exp(log_alpha)`` ``[B, n, n]`` towards a doubly stochastic
    matrix (Sinkhorn, 1964; Mena et al., 2018): alternate row and column ``logsumexp`` normalisation."""
    if log_alpha.dim() != 3 or log_alpha.shape[1] != log_alpha.shape[2]:
        raise ValueError(f"log_alpha must be [B, n, n]; got {tuple(log_alpha.shape)}")
    for _ in range(n_iter):
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=2, keepdim=True)
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=1, keepdim=True)
    return log_alpha.exp()


SINKHORN_LOSSES = ("l2", "midpoint", "random")


def sinkhorn_matching(spec: MLPSpec, theta_ref: Tensor, theta: Tensor, x: Tensor | None = None,
                      y: Tensor | None = None, *, loss: str = "l2", steps: int = 200, lr: float = 0.1,
                      tau: float = 1.0, n_iter: int = 20, batch_size: int = 256, init: list[Tensor] | None = None,
                      init_strength: float = 5.0, task_loss: str = "cross_entropy",
                      generator: torch.Generator | None = None, return_soft: bool = False):
    """Sinkhorn re-basin (Pena et al., 2023): learn score matrices ``M_l``, relax permutations to the doubly
    stochastic ``P_l = Sinkhorn(M_l / tau)``, apply them by einsum and minimise

    - ``l2``: ``||theta_ref - P(theta)||^2`` (no data);
    - ``midpoint``: the task loss of ``(theta_ref + P(theta)) / 2`` on data batches;
    - ``random``: the task loss of ``(1 - lam) theta_ref + lam P(theta)``, ``lam ~ U(0, 1)`` per step.

    All members are optimised at once (one Adam over ``[B, w, w]`` leaves). The result is hardened with the
    Hungarian method on ``P_l``. ``init`` (e.g. weight matching's permutations) starts ``M_l`` at
    ``init_strength`` times the one-hot matrices. Returns ``(perms, aligned)`` (plus the soft matrices with
    ``return_soft``).
    """
    _check_spec(spec)
    if loss not in SINKHORN_LOSSES:
        raise ValueError(f"loss must be one of {SINKHORN_LOSSES}; got {loss!r}")
    if loss != "l2" and (x is None or y is None):
        raise ValueError(f"the {loss!r} Sinkhorn loss needs data x and y")
    if tau <= 0 or steps < 0:
        raise ValueError(f"need tau > 0 and steps >= 0; got tau={tau}, steps={steps}")
    ref, theta = _pair(spec, theta_ref, theta)
    B, widths = theta.shape[0], symmetry_spec(spec).widths
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    scores = []
    for h, w in enumerate(widths):
        m = 1e-3 * torch.randn(B, w, w, generator=gen).to(theta)
        if init is not None:
            m = m + init_strength * torch.nn.functional.one_hot(init[h].long().expand(B, -1), w).to(theta)
        scores.append(m.requires_grad_(True))
    opt = torch.optim.Adam(scores, lr=lr)
    ref_b = ref.expand(B, -1)
    for step in range(steps):
        P = [sinkhorn(m / tau, n_iter) for m in scores]
        moved = permute_soft(spec, theta, P)
        if loss == "l2":
            objective = ((ref_b - moved) ** 2).sum()
        else:
            idx = torch.randint(0, x.shape[0], (min(batch_size, x.shape[0]),), generator=gen).to(x.device)
            lam = 0.5 if loss == "midpoint" else torch.rand(B, 1, generator=gen).to(theta)
            mix = (1 - lam) * ref_b + lam * moved
            objective = per_member_loss(spec, mix, x[idx], y[idx], task_loss).sum()
        if not torch.isfinite(objective):
            raise FloatingPointError(f"Sinkhorn objective became {objective.item()} at step {step}; lower lr")
        opt.zero_grad(set_to_none=True)
        objective.backward()
        opt.step()
    with torch.no_grad():
        P = [sinkhorn(m / tau, n_iter) for m in scores]
    perms = [hungarian(p) for p in P]
    aligned = permute(spec, theta, perms)
    return (perms, aligned, P) if return_soft else (perms, aligned)
