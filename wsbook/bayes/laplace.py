"""Laplace approximations around MAP estimates of a population (MacKay, 1992; Daxberger et al., 2021).

The posterior precision is approximated by the generalized Gauss-Newton matrix plus the prior precision,

    P = sum_n J_n^T Lambda_n J_n + delta I,     J_n = d f(x_n) / d theta,   Lambda_n = -d^2 log p(y_n | f) / d f^2,

kept ``full`` (eigendecomposition, small networks) or ``diag`` (its diagonal, larger networks), for every
member of a ``[B, D]`` population of MAP solutions at once. The prior precision ``delta`` is tuned per member by
maximising the Laplace evidence (Immer et al., 2021)

    log Z(delta) = log p(D | theta*) - delta/2 ||theta*||^2 + D/2 log delta - 1/2 log det P(delta).

Predictives: Monte Carlo over weights, or the linearized (GLM) predictive ``f(x, theta) ~ f(x, theta*) +
J(x)(theta - theta*)`` (Immer et al., 2021), which is what makes the GGN Laplace work well.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from wsbook.bayes.model import LogPosterior
from wsbook.nets import MLPSpec


def jacobian(spec: MLPSpec, theta: Tensor, x: Tensor) -> Tensor:
    """Output Jacobians of every member at every input: ``[B, N, out, D]`` (``torch.func`` vmap of jacrev)."""
    from torch.func import jacrev, vmap

    theta = spec.check(theta)

    def f(t: Tensor) -> Tensor:
        return spec.forward(t.unsqueeze(0), x)[0]

    return vmap(jacrev(f))(theta.detach())


def output_hessian(spec: MLPSpec, theta: Tensor, x: Tensor, likelihood: str, noise_std: float = 1.0) -> Tensor:
    """``Lambda_n = -d^2 log p(y|f)/df^2``: ``diag(p) - p p^T`` (categorical) or ``I / sigma^2``: ``[B, N, C, C]``."""
    with torch.no_grad():
        out = spec.forward(theta, x)
    if likelihood == "categorical":
        p = torch.softmax(out, -1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    eye = torch.eye(out.shape[-1], dtype=out.dtype, device=out.device) / noise_std ** 2
    return eye.expand(*out.shape[:2], -1, -1)


def ggn(spec: MLPSpec, theta: Tensor, x: Tensor, likelihood: str, noise_std: float = 1.0, kind: str = "full",
        chunk: int = 256) -> Tensor:
    """Generalized Gauss-Newton ``sum_n J_n^T Lambda_n J_n``: ``[B, D, D]`` (full) or ``[B, D]`` (diag)."""
    if kind not in ("full", "diag"):
        raise ValueError(f"kind must be 'full' or 'diag'; got {kind!r}")
    B, D = spec.check(theta).shape
    out = torch.zeros((B, D, D) if kind == "full" else (B, D), dtype=theta.dtype, device=theta.device)
    for i in range(0, x.shape[0], chunk):
        xb = x[i:i + chunk]
        J = jacobian(spec, theta, xb)                                   # [B, n, C, D]
        lam = output_hessian(spec, theta, xb, likelihood, noise_std)    # [B, n, C, C]
        LJ = torch.einsum("bnce,bned->bncd", lam, J)
        if kind == "full":
            out += torch.einsum("bncd,bnce->bde", J, LJ)
        else:
            out += (J * LJ).sum((1, 2))
    return out


@dataclass
class LaplacePosterior:
    """``N(mean, P^-1)`` per member with ``P = V diag(eigvals + prior_precision) V^T`` (full) or
    ``diag(eigvals + prior_precision)`` (diag, ``eigvecs`` is ``None``). Shapes: mean ``[B, D]``,
    eigvals ``[B, D]``, eigvecs ``[B, D, D]``, prior_precision ``[B]``."""

    spec: MLPSpec
    mean: Tensor
    eigvals: Tensor
    eigvecs: Tensor | None
    prior_precision: Tensor
    likelihood: str = "categorical"
    noise_std: float = 1.0
    log_evidence: Tensor | None = None

    @property
    def kind(self) -> str:
        return "diag" if self.eigvecs is None else "full"

    def _scale(self) -> Tensor:
        return (self.eigvals + self.prior_precision[:, None]).rsqrt()          # [B, D]

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` weight samples per member: ``[B, n, D]``."""
        if n < 1:
            raise ValueError(f"n must be positive; got {n}")
        z = torch.randn(*self.mean.shape[:1], n, self.mean.shape[1], generator=generator,
                        dtype=self.mean.dtype).to(self.mean.device) * self._scale().unsqueeze(1)
        if self.eigvecs is not None:
            z = torch.einsum("bde,bne->bnd", self.eigvecs, z)
        return self.mean.unsqueeze(1) + z

    def covariance(self) -> Tensor:
        """Posterior covariance ``[B, D, D]`` (full) or variances ``[B, D]`` (diag)."""
        s2 = self._scale() ** 2
        if self.eigvecs is None:
            return s2
        return torch.einsum("bde,be,bfe->bdf", self.eigvecs, s2, self.eigvecs)

    def glm_function_samples(self, x: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
        """Samples of the linearized network outputs ``f(x, theta*) + J(x) (theta - theta*)``: ``[B, n, N, C]``."""
        with torch.no_grad():
            f0 = self.spec.forward(self.mean, x)                             # [B, N, C]
        J = jacobian(self.spec, self.mean, x)                                 # [B, N, C, D]
        if self.eigvecs is not None:
            J = torch.einsum("bncd,bde->bnce", J, self.eigvecs)
        J = J * self._scale()[:, None, None, :]
        z = torch.randn(self.mean.shape[0], n, self.mean.shape[1], generator=generator,
                        dtype=self.mean.dtype).to(self.mean.device)
        return f0.unsqueeze(1) + torch.einsum("bncd,bsd->bsnc", J, z)

    def predictive(self, x: Tensor, n: int = 100, method: str = "glm",
                   generator: torch.Generator | None = None) -> Tensor:
        """Class probabilities per member ``[B, N, C]`` averaged over ``n`` samples, by the linearized
        (``glm``) or the plain Monte Carlo (``mc``, the network evaluated at sampled weights) predictive.
        For regression the returned tensor holds the sampled outputs ``[B, n, N, out]``."""
        if method == "glm":
            f = self.glm_function_samples(x, n, generator)
        elif method == "mc":
            th = self.sample(n, generator)
            with torch.no_grad():
                f = self.spec.forward(th.reshape(-1, th.shape[-1]), x).view(th.shape[0], n, x.shape[0], -1)
        else:
            raise ValueError(f"predictive method must be 'glm' or 'mc'; got {method!r}")
        if self.likelihood == "categorical":
            return torch.softmax(f, -1).mean(1)
        return f


def evidence(loglik: Tensor, theta: Tensor, eigvals: Tensor, delta: Tensor) -> Tensor:
    """Laplace log evidence for prior precisions ``delta [..., G]`` (eq. in the module docstring): ``[B, G]``."""
    D = theta.shape[-1]
    sq = (theta ** 2).sum(-1, keepdim=True)                                    # [B, 1]
    logdet = torch.log(eigvals.clamp_min(0).unsqueeze(-1) + delta.unsqueeze(-2)).sum(-2)   # [B, G]
    return loglik.unsqueeze(-1) - 0.5 * delta * sq + 0.5 * D * torch.log(delta) - 0.5 * logdet


def fit_laplace(log_posterior: LogPosterior, theta_map: Tensor, *, kind: str = "full", tune_prior: bool = True,
                grid: Tensor | None = None, chunk: int = 256) -> LaplacePosterior:
    """Laplace approximation at each MAP solution of ``theta_map [B, D]`` with a GGN (``full`` or ``diag``) and
    the prior precision tuned per member by maximising the Laplace evidence over ``grid`` (default
    ``10^[-3, 4]``); with ``tune_prior=False`` the log posterior's prior (which must be isotropic) is used."""
    lp = log_posterior
    spec = lp.spec
    theta = spec.check(theta_map).detach()
    if lp.learn_noise:
        raise ValueError("fit_laplace needs a fixed noise_std")
    G = ggn(spec, theta, lp.x, lp.likelihood, lp.noise_std, kind, chunk) / lp.temperature
    if kind == "full":
        G64 = G.double()
        G64 = 0.5 * (G64 + G64.transpose(1, 2))          # exact symmetry for the eigensolver
        eigvals, eigvecs = torch.linalg.eigh(G64)
        eigvals, eigvecs = eigvals.clamp_min(0.0).to(theta.dtype), eigvecs.to(theta.dtype)
    else:
        eigvals, eigvecs = G.clamp_min(0.0), None
    with torch.no_grad():
        loglik = lp.log_likelihood(theta) / lp.temperature
    stds = lp.prior.stds(spec, theta.device, theta.dtype)
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
    return LaplacePosterior(spec, theta, eigvals, eigvecs, delta, lp.likelihood, lp.noise_std, log_ev)
