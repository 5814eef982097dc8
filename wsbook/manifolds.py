"""Riemannian manifolds for flows: Euclidean space, spheres and products of many of them.

Every manifold acts on the last axis of a tensor (points are ``[..., dim]``, in ambient coordinates) and
offers the small interface of geoopt-style libraries: ``projx``, ``proju``, ``expmap``, ``logmap``,
``dist``, ``inner``/``norm``, ``transp`` (parallel transport), ``dexpinv`` (the inverse differential of the
exponential map, which makes Runge-Kutta steps in normal coordinates high order), ``geodesic``, base
sampling and log-density, and membership checks. A :class:`Product` of thousands of equal-dimension spheres is
computed by reshaping its block to ``[..., n_factors, n]`` (never by a Python loop over factors); the
geometry of the sphere follows Chen & Lipman (2024), "Riemannian Flow Matching on General Geometries".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

Tensor = torch.Tensor

#: Default tolerance of membership checks (float32 points after a few hundred exp-map steps stay well inside).
ATOL = 1e-4


def _safe_norm(v: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    """Euclidean norm whose gradient is 0 (not NaN) at v = 0 (the double-``where`` trick)."""
    sq = (v * v).sum(dim, keepdim=keepdim)
    positive = sq > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, sq, torch.ones_like(sq))), torch.zeros_like(sq))


def _randn(shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype | None,
           device: torch.device | str | None) -> Tensor:
    """Standard normals drawn on the generator's device (CPU generators stay reproducible) and moved."""
    gen_device = generator.device if generator is not None else device
    return torch.randn(*shape, generator=generator, dtype=dtype, device=gen_device).to(device or gen_device or "cpu")


def _check_last_dim(name: str, x: Tensor, dim: int) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] != dim:
        raise ValueError(f"{name}: expected a tensor whose last axis has size {dim}, got shape {tuple(x.shape)}")


class Manifold:
    """Interface shared by :class:`Euclidean`, :class:`Sphere` and :class:`Product` (points ``[..., dim]``)."""

    #: size of the flat ambient vector
    dim: int
    #: dimension of the manifold itself (e.g. 2 for the sphere in R^3)
    intrinsic_dim: int
    name: str = "manifold"

    # --- geometry (implemented by subclasses) ---------------------------------------------------------
    def projx(self, x: Tensor) -> Tensor:
        """Closest point on the manifold."""
        raise NotImplementedError

    def proju(self, x: Tensor, u: Tensor) -> Tensor:
        """Orthogonal projection of an ambient vector ``u`` onto the tangent space at ``x``."""
        raise NotImplementedError

    def expmap(self, x: Tensor, u: Tensor) -> Tensor:
        """Exponential map: the end point of the geodesic from ``x`` with initial velocity ``u``."""
        raise NotImplementedError

    def logmap(self, x: Tensor, y: Tensor) -> Tensor:
        """Logarithmic map: the tangent vector at ``x`` whose exp-map reaches ``y`` (inverse of ``expmap``)."""
        raise NotImplementedError

    def dist(self, x: Tensor, y: Tensor) -> Tensor:
        """Geodesic distance ``[...]``."""
        raise NotImplementedError

    def transp(self, x: Tensor, y: Tensor, v: Tensor) -> Tensor:
        """Parallel transport of the tangent vector ``v`` at ``x`` to ``y`` along the minimising geodesic."""
        raise NotImplementedError

    def dexpinv(self, x: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """Pull the tangent vector ``v`` at ``y = exp_x(u)`` back to the tangent space at ``x`` through the
        inverse differential of ``exp_x`` at ``u``: the ``w`` with ``d/ds exp_x(u + s w)|_0 = v``.

        In normal coordinates ``z`` around ``x`` (``y = exp_x(z)``) an ODE ``dy/dt = f(y)`` reads
        ``dz/dt = dexpinv(x, z, f(exp_x(z)))``, a smooth ODE in one vector space; a Runge-Kutta method applied
        to it keeps its order on the manifold (the ``rk4`` solver of :mod:`wsbook.flows` does this)."""
        raise NotImplementedError

    def inner(self, x: Tensor, u: Tensor, v: Tensor) -> Tensor:
        """Riemannian metric <u, v>_x (the ambient Euclidean inner product for every manifold here)."""
        return (u * v).sum(-1)

    def norm(self, x: Tensor, u: Tensor) -> Tensor:
        """``|u|_x``."""
        return _safe_norm(u)

    def geodesic(self, x: Tensor, y: Tensor, t: Tensor | float) -> Tensor:
        """Geodesic interpolation exp_x(t log_x y) (Chen & Lipman, eq. for the RFM conditional path)."""
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        if t.dim() > 0 and t.dim() < x.dim():
            t = t.reshape(*t.shape, *([1] * (x.dim() - t.dim())))
        return self.expmap(x, t * self.logmap(x, y))

    # --- base distribution -----------------------------------------------------------------------------
    def random_base(self, *shape: int, generator: torch.Generator | None = None,
                    device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Tensor:
        """Samples ``[*shape, dim]`` of the base distribution (uniform on spheres, N(0, I) on Euclidean parts)."""
        raise NotImplementedError

    def base_logprob(self, x: Tensor) -> Tensor:
        """Log-density of :meth:`random_base` w.r.t. the Riemannian volume, ``[...]``."""
        raise NotImplementedError

    # --- checks ----------------------------------------------------------------------------------------
    def belongs(self, x: Tensor, atol: float = ATOL) -> Tensor:
        """Boolean ``[...]``: is each point on the manifold (within ``atol``)?"""
        _check_last_dim(f"{self.name}.belongs", x, self.dim)
        return (self.projx(x) - x).abs().amax(-1) <= atol

    def is_tangent(self, x: Tensor, u: Tensor, atol: float = ATOL) -> Tensor:
        """Boolean ``[...]``: is ``u`` in the tangent space at ``x`` (within ``atol``)?"""
        _check_last_dim(f"{self.name}.is_tangent", u, self.dim)
        return (self.proju(x, u) - u).abs().amax(-1) <= atol

    def check_point(self, x: Tensor, atol: float = ATOL, name: str = "x") -> Tensor:
        """Raise ``ValueError`` unless every point of ``x`` lies on the manifold; return ``x``."""
        _check_last_dim(f"{self.name}.check_point({name})", x, self.dim)
        if not torch.isfinite(x).all():
            raise ValueError(f"{name}: expected finite points on {self!r}, got NaN or inf")
        ok = self.belongs(x, atol)
        if not bool(ok.all()):
            err = (self.projx(x) - x).abs().amax(-1).max().item()
            raise ValueError(f"{name}: expected points on {self!r} (tolerance {atol:g}); "
                             f"{int((~ok).sum())} of {ok.numel()} are off it (largest deviation {err:.3g})")
        return x

    def check_vector(self, x: Tensor, u: Tensor, atol: float = ATOL, name: str = "u") -> Tensor:
        """Raise ``ValueError`` unless ``u`` is tangent at ``x``; return ``u``."""
        _check_last_dim(f"{self.name}.check_vector({name})", u, self.dim)
        ok = self.is_tangent(x, u, atol)
        if not bool(ok.all()):
            err = (self.proju(x, u) - u).abs().amax(-1).max().item()
            raise ValueError(f"{name}: expected tangent vectors at x on {self!r} (tolerance {atol:g}); "
                             f"{int((~ok).sum())} of {ok.numel()} are not (largest normal part {err:.3g})")
        return u

    def pairwise_sqdist(self, x: Tensor, y: Tensor, chunk: int = 64) -> Tensor:
        """``[N, M]`` squared geodesic distances between two point sets ``[N, dim]`` and ``[M, dim]``."""
        _check_last_dim(f"{self.name}.pairwise_sqdist(x)", x, self.dim)
        _check_last_dim(f"{self.name}.pairwise_sqdist(y)", y, self.dim)
        rows = [self.dist(x[i:i + chunk, None, :], y[None, :, :]) ** 2 for i in range(0, x.shape[0], chunk)]
        return torch.cat(rows, 0)


class Euclidean(Manifold):
    """Flat R^d: exp is addition, log is subtraction, transport is the identity; base N(0, I)."""

    def __init__(self, dim: int):
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"Euclidean: expected a positive integer dimension, got {dim!r}")
        self.dim = self.intrinsic_dim = dim
        self.name = f"Euclidean({dim})"

    def __repr__(self) -> str:
        return self.name

    def projx(self, x: Tensor) -> Tensor:
        return x

    def proju(self, x: Tensor, u: Tensor) -> Tensor:
        return u

    def expmap(self, x: Tensor, u: Tensor) -> Tensor:
        return x + u

    def logmap(self, x: Tensor, y: Tensor) -> Tensor:
        return y - x

    def dist(self, x: Tensor, y: Tensor) -> Tensor:
        return _safe_norm(y - x)

    def transp(self, x: Tensor, y: Tensor, v: Tensor) -> Tensor:
        return v

    def dexpinv(self, x: Tensor, u: Tensor, v: Tensor) -> Tensor:
        return v

    def pairwise_sqdist(self, x: Tensor, y: Tensor, chunk: int = 64) -> Tensor:
        _check_last_dim(f"{self.name}.pairwise_sqdist(x)", x, self.dim)
        _check_last_dim(f"{self.name}.pairwise_sqdist(y)", y, self.dim)
        return torch.cdist(x, y) ** 2

    def random_base(self, *shape: int, generator: torch.Generator | None = None,
                    device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Tensor:
        return _randn((*shape, self.dim), generator, dtype, device)

    def base_logprob(self, x: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.base_logprob", x, self.dim)
        return -0.5 * (x * x).sum(-1) - 0.5 * self.dim * math.log(2 * math.pi)


class Sphere(Manifold):
    """The unit sphere S^{n-1} in R^n (``n`` = ambient size of one point), with the round metric.

    ``exp_x(u) = cos|u| x + sin|u| u/|u|``; ``log_x(y) = d(x, y) P_x(y)/|P_x(y)|`` with P_x the tangent projection;
    ``d(x, y) = 2 atan2(|x - y|, |x + y|)``, which is accurate both at 0 and near the antipode. ``P_x(y)`` is
    computed from ``y - x`` when ``y`` is in the hemisphere around ``x`` and from ``y + x`` otherwise, so
    both its length (``sin d``) and its direction stay accurate near 0 and near pi; the small-angle series
    is used only near 0 (chosen on ``d``, not on ``sin d``, which is small at both ends).
    """

    def __init__(self, n: int):
        if not isinstance(n, int) or n < 2:
            raise ValueError(f"Sphere: expected an ambient dimension n >= 2 (S^(n-1) in R^n), got {n!r}")
        self.dim = n
        self.intrinsic_dim = n - 1
        self.name = f"Sphere(S^{n - 1} in R^{n})"

    def __repr__(self) -> str:
        return self.name

    def projx(self, x: Tensor) -> Tensor:
        return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)

    def proju(self, x: Tensor, u: Tensor) -> Tensor:
        return u - (x * u).sum(-1, keepdim=True) * x

    def expmap(self, x: Tensor, u: Tensor) -> Tensor:
        r = _safe_norm(u, keepdim=True)
        small = r < 1e-6
        r_safe = torch.where(small, torch.ones_like(r), r)
        sinc = torch.where(small, 1 - r * r / 6, torch.sin(r_safe) / r_safe)
        return self.projx(torch.cos(r) * x + sinc * u)

    def logmap(self, x: Tensor, y: Tensor) -> Tensor:
        # P_x(y) = y - <x, y> x, of length sin d; for unit x, y it equals (y - x) + |y - x|^2/2 x and
        # (y + x) - |y + x|^2/2 x: the first is accurate near x, the second near -x.
        x, y = torch.broadcast_tensors(x, y)
        diff, summ = y - x, y + x
        nd, ns = _safe_norm(diff, keepdim=True), _safe_norm(summ, keepdim=True)
        near = nd <= ns                                            # d <= pi/2
        u = torch.where(near, diff + 0.5 * nd * nd * x, summ - 0.5 * ns * ns * x)
        u = u - (x * u).sum(-1, keepdim=True) * x                  # exact tangency (x may be off by rounding)
        d = 2 * torch.atan2(nd, ns)
        s = _safe_norm(u, keepdim=True)
        positive = s > 0
        factor = torch.where(positive, d / torch.where(positive, s, torch.ones_like(s)), torch.ones_like(s))
        # exactly antipodal (P_x(y) = 0 but d = pi): every direction is a minimising geodesic; take a fixed
        # one, towards the axis least aligned with x (computed for all points: no host synchronisation)
        axis = torch.zeros_like(x).scatter_(-1, x.detach().abs().argmin(-1, keepdim=True), 1.0)
        t = self.proju(x, axis)
        fallback = d * t / _safe_norm(t, keepdim=True).clamp_min(1e-30)
        return torch.where(~positive & ~near, fallback, factor * u)

    def dist(self, x: Tensor, y: Tensor) -> Tensor:
        return 2 * torch.atan2(_safe_norm(x - y), _safe_norm(x + y))

    def transp(self, x: Tensor, y: Tensor, v: Tensor) -> Tensor:
        # exact parallel transport along the great circle: v - <y, v>/(1 + <x, y>) (x + y)
        denom = (1 + (x * y).sum(-1, keepdim=True)).clamp_min(1e-7)
        return v - (y * v).sum(-1, keepdim=True) / denom * (x + y)

    def dexpinv(self, x: Tensor, u: Tensor, v: Tensor) -> Tensor:
        # exp_x(u) = cos r x + sin r e (r = |u|, e = u / r). Its differential maps the radial direction e to
        # the geodesic's unit velocity g = -sin r x + cos r e at y, and a direction w orthogonal to x and e to
        # (sin r / r) w (a Jacobi field). Inverting: w = <v, g> e + (r / sin r) (v - <v, g> g), for r < pi.
        r = _safe_norm(u, keepdim=True)
        positive = r > 0
        e = u / torch.where(positive, r, torch.ones_like(r))
        cos, sin = torch.cos(r), torch.sin(r)
        y = cos * x + sin * e
        g = cos * e - sin * x
        v = v - (y * v).sum(-1, keepdim=True) * y                  # the tangent part at y
        a = (v * g).sum(-1, keepdim=True)
        small = r < 1e-4
        ratio = torch.where(small, 1 + r * r / 6, r / torch.where(small, torch.ones_like(sin), sin))
        return a * e + ratio * (v - a * g)

    def pairwise_sqdist(self, x: Tensor, y: Tensor, chunk: int = 64) -> Tensor:
        _check_last_dim(f"{self.name}.pairwise_sqdist(x)", x, self.dim)
        _check_last_dim(f"{self.name}.pairwise_sqdist(y)", y, self.dim)
        return torch.arccos((x @ y.T).clamp(-1, 1)) ** 2

    def random_base(self, *shape: int, generator: torch.Generator | None = None,
                    device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Tensor:
        return self.projx(_randn((*shape, self.dim), generator, dtype, device))

    random_uniform = random_base

    def log_volume(self) -> float:
        """log of the area of S^{n-1}: log(2 pi^{n/2} / Gamma(n/2))."""
        n = self.dim
        return math.log(2.0) + 0.5 * n * math.log(math.pi) - math.lgamma(0.5 * n)

    def base_logprob(self, x: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.base_logprob", x, self.dim)
        return torch.full(x.shape[:-1], -self.log_volume(), dtype=x.dtype, device=x.device)

    uniform_logprob = base_logprob


@dataclass(frozen=True)
class Block:
    """A contiguous slice of a :class:`Product`'s flat vector: ``n_factors`` copies of ``manifold``."""

    kind: str
    n_factors: int
    factor_dim: int
    start: int

    @property
    def stop(self) -> int:
        return self.start + self.n_factors * self.factor_dim

    @property
    def slice(self) -> slice:
        return slice(self.start, self.stop)


class Product(Manifold):
    """A product of spheres (of equal or different sizes) and Euclidean blocks, laid out contiguously.

    Each block holds ``n_factors`` equal factors; its slice of the flat vector is reshaped to
    ``[..., n_factors, factor_dim]`` and handled in one batched call, so thousands of spheres cost one
    reshape. The metric is the sum of the factors' metrics, hence d(x, y)^2 = sum_k d_k(x_k, y_k)^2.
    """

    def __init__(self, blocks: list[Block]):
        if not blocks:
            raise ValueError("Product: expected at least one block, got none")
        self.blocks = list(blocks)
        self._factor = {}
        for b in self.blocks:
            if b.kind == "sphere":
                self._factor[b.start] = Sphere(b.factor_dim)
            else:
                self._factor[b.start] = Euclidean(b.factor_dim)
        self.dim = self.blocks[-1].stop
        self.intrinsic_dim = sum(b.n_factors * self._factor[b.start].intrinsic_dim for b in self.blocks)
        self.name = "Product(" + ", ".join(f"{b.n_factors}x{b.kind}{b.factor_dim}" for b in self.blocks) + ")"

    def __repr__(self) -> str:
        return self.name

    @classmethod
    def from_blocks(cls, blocks: list[tuple[str, int, int]]) -> "Product":
        """Build from ``[("sphere", n_factors, ambient_dim_per_factor) | ("euclidean", 1, dim), ...]``,
        laid out contiguously in that order."""
        if not isinstance(blocks, (list, tuple)) or not blocks:
            raise ValueError(f"Product.from_blocks: expected a non-empty list of (kind, n_factors, dim), got {blocks!r}")
        out, start = [], 0
        for i, blk in enumerate(blocks):
            if not (isinstance(blk, (tuple, list)) and len(blk) == 3):
                raise ValueError(f"Product.from_blocks: block {i} must be (kind, n_factors, dim), got {blk!r}")
            kind, n, d = blk
            if kind not in ("sphere", "euclidean"):
                raise ValueError(f"Product.from_blocks: block {i} kind must be 'sphere' or 'euclidean', got {kind!r}")
            if not (isinstance(n, int) and isinstance(d, int) and n >= 1 and d >= 1):
                raise ValueError(f"Product.from_blocks: block {i} needs positive integer sizes, got {blk!r}")
            if kind == "sphere" and d < 2:
                raise ValueError(f"Product.from_blocks: sphere block {i} needs ambient dim >= 2, got {d}")
            if kind == "euclidean":      # several Euclidean factors are one Euclidean block
                n, d = 1, n * d
            out.append(Block(kind, n, d, start))
            start += n * d
        return cls(out)

    @classmethod
    def spheres(cls, n_factors: int, n: int) -> "Product":
        """``n_factors`` copies of S^{n-1}."""
        return cls.from_blocks([("sphere", n_factors, n)])

    # -- block plumbing -------------------------------------------------------------------------------
    def _split(self, *tensors: Tensor):
        """Yield (factor manifold, block, reshaped tensors [..., n_factors, factor_dim]) per block."""
        for b in self.blocks:
            parts = [t[..., b.slice].reshape(*t.shape[:-1], b.n_factors, b.factor_dim) for t in tensors]
            yield self._factor[b.start], b, parts

    def _map(self, fn_name: str, *tensors: Tensor) -> Tensor:
        outs = []
        for m, b, parts in self._split(*tensors):
            r = getattr(m, fn_name)(*parts)
            outs.append(r.reshape(*r.shape[:-2], b.n_factors * b.factor_dim))
        return torch.cat(outs, -1) if len(outs) > 1 else outs[0]

    def factor_view(self, x: Tensor, block: int = 0) -> Tensor:
        """The ``block``-th block of ``x`` as ``[..., n_factors, factor_dim]`` (a view)."""
        b = self.blocks[block]
        return x[..., b.slice].reshape(*x.shape[:-1], b.n_factors, b.factor_dim)

    def norm_deviation(self, x: Tensor) -> Tensor:
        """``[...]``: the largest ``| |x_k| - 1 |`` over all sphere factors k (0 on the manifold; how far a
        Euclidean operation has drifted off it)."""
        _check_last_dim(f"{self.name}.norm_deviation", x, self.dim)
        devs = [(parts[0].norm(dim=-1) - 1).abs().amax(-1) for m, b, parts in self._split(x) if b.kind == "sphere"]
        if not devs:
            return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        return torch.stack(devs, -1).amax(-1)

    def projx(self, x: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.projx", x, self.dim)
        return self._map("projx", x)

    def proju(self, x: Tensor, u: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.proju", u, self.dim)
        return self._map("proju", x, u)

    def expmap(self, x: Tensor, u: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.expmap", u, self.dim)
        return self._map("expmap", x, u)

    def logmap(self, x: Tensor, y: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.logmap", y, self.dim)
        return self._map("logmap", x, y)

    def transp(self, x: Tensor, y: Tensor, v: Tensor) -> Tensor:
        return self._map("transp", x, y, v)

    def dexpinv(self, x: Tensor, u: Tensor, v: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.dexpinv", v, self.dim)
        return self._map("dexpinv", x, u, v)

    def factor_dist(self, x: Tensor, y: Tensor, block: int = 0) -> Tensor:
        """Per-factor distances ``[..., n_factors]`` of one block."""
        b = self.blocks[block]
        xs, ys = (t[..., b.slice].reshape(*t.shape[:-1], b.n_factors, b.factor_dim) for t in (x, y))
        return self._factor[b.start].dist(xs, ys)

    def dist(self, x: Tensor, y: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.dist", y, self.dim)
        sq = sum((m.dist(px, py) ** 2).sum(-1) for m, b, (px, py) in self._split(x, y))
        positive = sq > 0
        return torch.where(positive, torch.sqrt(torch.where(positive, sq, torch.ones_like(sq))), torch.zeros_like(sq))

    def pairwise_sqdist(self, x: Tensor, y: Tensor, chunk: int = 64) -> Tensor:
        _check_last_dim(f"{self.name}.pairwise_sqdist(x)", x, self.dim)
        _check_last_dim(f"{self.name}.pairwise_sqdist(y)", y, self.dim)
        total = x.new_zeros(x.shape[0], y.shape[0])
        for m, b, (px, py) in self._split(x, y):
            if isinstance(m, Euclidean):
                total = total + torch.cdist(px[:, 0], py[:, 0]) ** 2
                continue
            for i in range(0, px.shape[0], chunk):          # chunks of rows bound the [chunk, M, K] memory
                cos = torch.einsum("ikn,jkn->ijk", px[i:i + chunk], py).clamp(-1, 1)
                total[i:i + chunk] += (torch.arccos(cos) ** 2).sum(-1)
        return total

    def random_base(self, *shape: int, generator: torch.Generator | None = None,
                    device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Tensor:
        z = _randn((*shape, self.dim), generator, dtype, device)
        return self.projx(z)

    def base_logprob(self, x: Tensor) -> Tensor:
        _check_last_dim(f"{self.name}.base_logprob", x, self.dim)
        total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        for m, b, (px,) in self._split(x):
            total = total + m.base_logprob(px).sum(-1)
        return total

    def random_uniform(self, *shape: int, generator: torch.Generator | None = None,
                       device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Tensor:
        """Uniform samples on a product of spheres (raises if there is a Euclidean block)."""
        self._require_compact()
        return self.random_base(*shape, generator=generator, device=device, dtype=dtype)

    def uniform_logprob(self, x: Tensor) -> Tensor:
        """-log volume of a product of spheres (raises if there is a Euclidean block)."""
        self._require_compact()
        return self.base_logprob(x)

    def _require_compact(self) -> None:
        if any(b.kind == "euclidean" for b in self.blocks):
            raise ValueError(f"{self.name} has a Euclidean block: no uniform distribution; use random_base")


__all__ = ["Manifold", "Euclidean", "Sphere", "Product", "Block", "ATOL"]
