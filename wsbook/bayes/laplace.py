"""Laplace approximations around MAP estimates of a population (MacKay, 1992; Daxberger et al., 2021).

The posterior precision is approximated by the generalized Gauss-Newton matrix plus the prior precision,
both divided by the temperature ``T`` of the tempered posterior ``p_T ∝ exp((log prior + log lik) / T)``
(the target every method of :mod:`wsbook.bayes` shares),

    P = (sum_n J_n^T Lambda_n J_n + delta I) / T,   J_n = d f(x_n) / d theta,   Lambda_n = -d^2 log p(y_n | f) / d f^2,

kept ``full`` (eigendecomposition, small networks) or ``diag`` (its diagonal, larger networks), for every
member of a ``[B, D]`` population of MAP solutions at once. The prior precision ``delta`` is tuned per member by
maximising the Laplace evidence (Immer et al., 2021)

    log Z(delta) = log p(D | theta*) - delta/2 ||theta*||^2 + D/2 log delta - 1/2 log det P_1(delta),

the evidence of the untempered model (``P_1`` is ``P`` at ``T = 1``): the model's marginal likelihood, which
does not depend on the temperature at which the posterior is then used.

Predictives: Monte Carlo over weights, or the linearized (GLM) predictive ``f(x, theta) ~ f(x, theta*) +
J(x)(theta - theta*)`` (Immer et al., 2021), which is what makes the GGN Laplace work well.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from wsbook.bayes.model import LogPosterior
from wsbook.bayes.samples import SampleResult, member_draws
from wsbook.nets import MLPSpec, check_task


def jacobian(spec: MLPSpec, theta: Tensor, x: Tensor) -> Tensor:
    """Output Jacobians of every member at every input: ``[B, N, out, D]``.

    Every input gets its own copy of its member's weights (a population of ``B * N`` networks with one input
    each), so one backward pass per output gives the gradients at all inputs at once; differentiating the
    batch's outputs through shared weights would pull every output back through all ``N`` inputs."""
    theta = spec.check(theta).detach()
    (B, D), N = theta.shape, x.shape[0]
    with torch.enable_grad():
        rows = theta.unsqueeze(1).expand(B, N, D).reshape(B * N, D).requires_grad_(True)
        out = spec.forward(rows, x.unsqueeze(1).repeat(B, 1, 1))[:, 0, :]           # [B*N, out]
        # one pass per output: a vmapped (is_grads_batched) backward costs more for a few outputs
        grads = [torch.autograd.grad(out[:, c].sum(), rows, retain_graph=c < out.shape[1] - 1)[0]
                 for c in range(out.shape[1])]
    return torch.stack(grads, 1).view(B, N, -1, D)


def output_hessian(spec: MLPSpec, theta: Tensor, x: Tensor, task: str, noise_std: float = 1.0) -> Tensor:
    """``Lambda_n = -d^2 log p(y|f)/df^2``: ``diag(p) - p p^T`` (classification) or ``I / sigma^2``
    (regression): ``[B, N, C, C]``."""
    task = check_task(task)
    with torch.no_grad():
        out = spec.forward(theta, x)
    if task == "classification":
        p = torch.softmax(out, -1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    eye = torch.eye(out.shape[-1], dtype=out.dtype, device=out.device) / noise_std ** 2
    return eye.expand(*out.shape[:2], -1, -1)


def ggn(spec: MLPSpec, theta: Tensor, x: Tensor, task: str, noise_std: float = 1.0, kind: str = "full",
        chunk: int = 256) -> Tensor:
    """Generalized Gauss-Newton ``sum_n J_n^T Lambda_n J_n``: ``[B, D, D]`` (full) or ``[B, D]`` (diag), for
    ``task`` ``"classification"`` or ``"regression"`` (observation noise ``noise_std``)."""
    if kind not in ("full", "diag"):
        raise ValueError(f"kind must be 'full' or 'diag'; got {kind!r}")
    B, D = spec.check(theta).shape
    out = torch.zeros((B, D, D) if kind == "full" else (B, D), dtype=theta.dtype, device=theta.device)
    for i in range(0, x.shape[0], chunk):
        xb = x[i:i + chunk]
        J = jacobian(spec, theta, xb)                                   # [B, n, C, D]
        lam = output_hessian(spec, theta, xb, task, noise_std)          # [B, n, C, C]
        LJ = torch.einsum("bnce,bned->bncd", lam, J)
        if kind == "full":
            out += torch.einsum("bncd,bnce->bde", J, LJ)
        else:
            out += (J * LJ).sum((1, 2))
    return out


@dataclass
class LaplacePosterior:
    """``N(mean, P^-1)`` per member with ``P = V diag(eigvals + prior_precision) V^T / temperature`` (full) or
    ``diag(eigvals + prior_precision) / temperature`` (diag, ``eigvecs`` is ``None``); ``eigvals`` are those
    of the GGN. Shapes: mean ``[B, D]``, eigvals ``[B, D]``, eigvecs ``[B, D, D]``, prior_precision ``[B]``."""

    spec: MLPSpec
    mean: Tensor
    eigvals: Tensor
    eigvecs: Tensor | None
    prior_precision: Tensor
    task: str = "classification"
    noise_std: float = 1.0
    log_evidence: Tensor | None = None
    temperature: float = 1.0

    @property
    def kind(self) -> str:
        return "diag" if self.eigvecs is None else "full"

    @property
    def n_members(self) -> int:
        return self.mean.shape[0]

    def _scale(self) -> Tensor:
        """Posterior standard deviations along the eigenvectors, ``sqrt(T / (eigvals + delta))``: ``[B, D]``."""
        return (self.eigvals + self.prior_precision[:, None]).rsqrt() * math.sqrt(self.temperature)

    def _member_samples(self, n: int, generator: torch.Generator | None) -> Tensor:
        """``n`` weight samples of every member: ``[B, n, D]``."""
        _check_count(n)
        z = torch.randn(*self.mean.shape[:1], n, self.mean.shape[1], generator=generator,
                        dtype=self.mean.dtype).to(self.mean.device) * self._scale().unsqueeze(1)
        if self.eigvecs is not None:
            z = torch.einsum("bde,bne->bnd", self.eigvecs, z)
        return self.mean.unsqueeze(1) + z

    def sample(self, n: int, generator: torch.Generator | None = None) -> SampleResult:
        """``n`` weight draws spread over the members, draw-major: ``.samples [n, D]`` with row ``i`` from
        member ``.chain[i] = i % B``."""
        eps, member = member_draws(n, self.n_members, generator, self.mean.dtype, self.mean.shape[1],
                                   self.mean.device)
        z = eps * self._scale()                                                # [R, B, D]
        if self.eigvecs is not None:
            z = torch.einsum("bde,rbe->rbd", self.eigvecs, z)
        draws = (self.mean + z).reshape(-1, self.mean.shape[1])[:n]
        return SampleResult(samples=draws, chain=member, n_chains=self.n_members)

    def covariance(self) -> Tensor:
        """Posterior covariance ``[B, D, D]`` (full) or variances ``[B, D]`` (diag)."""
        s2 = self._scale() ** 2
        if self.eigvecs is None:
            return s2
        return torch.einsum("bde,be,bfe->bdf", self.eigvecs, s2, self.eigvecs)

    def _scaled_jacobian(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The outputs at the mean ``[B, N, C]`` and the Jacobian in the posterior's whitened coordinates,
        ``J(x) V diag(s)`` ``[B, N, C, D]``: the linearized outputs are ``f0 + (J V s) z`` with ``z ~ N(0, I)``."""
        with torch.no_grad():
            f0 = self.spec.forward(self.mean, x)                             # [B, N, C]
        J = jacobian(self.spec, self.mean, x)                                 # [B, N, C, D]
        if self.eigvecs is not None:
            J = torch.einsum("bncd,bde->bnce", J, self.eigvecs)
        return f0, J * self._scale()[:, None, None, :]

    def glm_output_distribution(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The linearized network's outputs at each input as a Gaussian: mean ``[B, N, C]`` and covariance
        ``J Σ Jᵀ`` ``[B, N, C, C]`` (the GLM predictive before the link)."""
        f0, J = self._scaled_jacobian(x)
        return f0, J @ J.transpose(-1, -2)

    def glm_function_samples(self, x: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
        """Samples of the linearized network outputs ``f(x, theta*) + J(x) (theta - theta*)``: ``[B, n, N, C]``,
        each sample one draw of the weights, so a sample is a function over all of ``x`` jointly."""
        f0, J = self._scaled_jacobian(x)
        z = torch.randn(self.mean.shape[0], n, self.mean.shape[1], generator=generator,
                        dtype=self.mean.dtype).to(self.mean.device)
        # outputs kept class-major, [B, n, out, N] in memory (as the forward returns them): a softmax over few
        # classes then runs along contiguous points
        return f0.unsqueeze(1) + torch.einsum("bncd,bsd->bscn", J, z).transpose(2, 3)

    def predictive(self, x: Tensor, n: int = 100, method: str = "glm",
                   generator: torch.Generator | None = None) -> Tensor:
        """Class probabilities per member ``[B, N, C]`` averaged over ``n`` samples, by the linearized
        (``glm``) or the plain Monte Carlo (``mc``, the network evaluated at sampled weights) predictive.
        For regression the returned tensor holds the sampled outputs ``[B, n, N, out]``.

        The ``glm`` samples are drawn from each input's output Gaussian (:meth:`glm_output_distribution`), a
        ``C``-dimensional draw per input instead of a ``D``-dimensional one per function: the predictive at an
        input depends on that input's marginal only (draws at different inputs are independent; for samples
        that are functions over all inputs, use :meth:`glm_function_samples`)."""
        _check_count(n)
        if method == "glm":
            f0, cov = self.glm_output_distribution(x)
            evals, evecs = torch.linalg.eigh(cov)                            # a root of the PSD covariance
            root = evecs * evals.clamp_min(0).sqrt().unsqueeze(-2)            # [B, N, C, C]
            z = torch.randn(f0.shape[0], n, *f0.shape[1:], generator=generator, dtype=f0.dtype).to(f0.device)
            f = f0.unsqueeze(1) + torch.einsum("bnce,bsne->bsnc", root, z)
        elif method == "mc":
            th = self._member_samples(n, generator)
            with torch.no_grad():
                f = self.spec.forward(th.reshape(-1, th.shape[-1]), x).view(th.shape[0], n, x.shape[0], -1)
        else:
            raise ValueError(f"predictive method must be 'glm' or 'mc'; got {method!r}")
        if self.task == "classification":
            return torch.softmax(f, -1).mean(1)
        return f


def _check_count(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of samples; got {n!r}")


def evidence(loglik: Tensor, theta: Tensor, eigvals: Tensor, delta: Tensor) -> Tensor:
    """Laplace log evidence for prior precisions ``delta [..., G]`` (eq. in the module docstring): ``[B, G]``."""
    D = theta.shape[-1]
    sq = (theta ** 2).sum(-1, keepdim=True)                                    # [B, 1]
    logdet = torch.log(eigvals.clamp_min(0).unsqueeze(-1) + delta.unsqueeze(-2)).sum(-2)   # [B, G]
    return loglik.unsqueeze(-1) - 0.5 * delta * sq + 0.5 * D * torch.log(delta) - 0.5 * logdet


def fit_laplace(log_posterior: LogPosterior, theta_map: Tensor, *, kind: str = "full", tune_prior: bool = True,
                grid: Tensor | None = None, chunk: int = 256) -> LaplacePosterior:
    """Laplace approximation of the log posterior's tempered posterior at each MAP solution of ``theta_map``.

    The precision is ``(GGN + delta I) / T`` (module docstring), so the approximation targets the same
    ``p_T`` as HMC, MAP and VI; for a linear-Gaussian model it is exact at every temperature.
    See chapter 2, "Inference".

    Args:
        log_posterior: the :class:`LogPosterior` (its public ``spec``, ``x``, ``task``, ``noise_std``,
            ``temperature``, ``log_likelihood`` and ``prior_stds`` are used).
        theta_map: MAP solutions ``[B, D]`` (e.g. from :func:`~wsbook.bayes.fit_map`).
        kind: ``"full"`` GGN (eigendecomposition, small networks) or ``"diag"``.
        tune_prior: choose ``delta`` per member by maximising the Laplace evidence over ``grid`` (default
            ``10^[-3, 4]``); with ``False`` the log posterior's prior (which must be isotropic) is used.
        grid: candidate prior precisions.
        chunk: data points per Jacobian chunk.
    """
    lp = log_posterior
    spec = lp.spec
    theta = spec.check(theta_map).detach()
    if lp.learn_noise:
        raise ValueError("fit_laplace needs a fixed noise_std")
    G = ggn(spec, theta, lp.x, lp.task, lp.noise_std, kind, chunk)
    if kind == "full":
        G64 = G.double()
        G64 = 0.5 * (G64 + G64.transpose(1, 2))          # exact symmetry for the eigensolver
        eigvals, eigvecs = torch.linalg.eigh(G64)
        eigvals, eigvecs = eigvals.clamp_min(0.0).to(theta.dtype), eigvecs.to(theta.dtype)
    else:
        eigvals, eigvecs = G.clamp_min(0.0), None
    with torch.no_grad():
        loglik = lp.log_likelihood(theta)
    stds = lp.prior_stds().to(theta)
    if tune_prior:
        grid = torch.logspace(-3, 4, 141, dtype=theta.dtype, device=theta.device) if grid is None else grid
        ev = evidence(loglik, theta, eigvals, grid.expand(theta.shape[0], -1))
        best = ev.argmax(-1)
        delta, log_ev = grid[best], ev.gather(-1, best[:, None]).squeeze(-1)
    else:
        if not torch.allclose(stds, stds[0]):
            raise ValueError("tune_prior=False needs an isotropic prior (one std for all layers)")
        delta = torch.full((theta.shape[0],), float(stds[0]) ** -2, dtype=theta.dtype, device=theta.device)
        log_ev = evidence(loglik, theta, eigvals, delta[:, None]).squeeze(-1)
    return LaplacePosterior(spec, theta, eigvals, eigvecs, delta, lp.task, lp.noise_std, log_ev, float(lp.temperature))
