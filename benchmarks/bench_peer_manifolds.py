"""wsbook.manifolds against geoopt on a product of 10,000 spheres of mixed dimensions.

The same product (``S^1``, ``S^2``, ``S^4`` and ``S^15`` factors, laid out block after block) as one
``wsbook.manifolds.Product`` and as one ``geoopt.ProductManifold`` of ``geoopt.Sphere`` factors. Agreement
(float64, to 1e-6): ``expmap``, ``logmap`` and ``dist`` of the two libraries at the same points, for pairs at
geodesic distances in [0.2, 2.8] (away from geoopt's clamp of the inner product near +-1). geoopt's
``Sphere.transp`` is the tangent projection (a vector transport, not parallel transport), so our exact
parallel transport is checked against the closed form built from geoopt's log maps instead: the unit
direction ``log_x y`` goes to ``-log_y x`` and the orthogonal complement is unchanged. Timing: each operation
on a batch of points, ours against geoopt's (for ``transp``: our parallel transport against geoopt's projection).

Prints ``name, ours, peer, ratio`` lines (seconds per call; ratio = peer / ours, > 1 means wsbook is faster).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from wsbook.manifolds import Product  # noqa: E402

from timing import best_seconds  # noqa: E402  (the script's own folder is on sys.path)

#: (number of factors, ambient size of one factor): 10,000 spheres of four dimensions
BLOCKS = ((4000, 2), (3000, 3), (2000, 5), (1000, 16))
TOL = 1e-6


def build(blocks=BLOCKS):
    """The same product in both libraries: ``(ours, geoopt's)``."""
    import geoopt

    ours = Product.from_blocks([("sphere", n, d) for n, d in blocks])
    peer = geoopt.ProductManifold(*[(geoopt.Sphere(), d) for n, d in blocks for _ in range(n)])
    return ours, peer


def points(ours: Product, batch: int, generator: torch.Generator):
    """Points ``x``, tangent vectors ``u`` with every factor's norm in [0.2, 2.8], ``y = exp_x(u)``, and
    a second tangent vector ``v`` at ``x`` (float64, ``[batch, dim]``)."""
    dt = torch.float64
    x = ours.random_base(batch, generator=generator, dtype=dt)
    u = ours.proju(x, torch.randn(x.shape, generator=generator, dtype=dt))
    v = ours.proju(x, torch.randn(x.shape, generator=generator, dtype=dt))
    parts = []
    for k, b in enumerate(ours.blocks):                 # rescale every factor of u to a norm in [0.2, 2.8]
        f = ours.factor_view(u, k)
        r = 0.2 + 2.6 * torch.rand(*f.shape[:-1], 1, generator=generator, dtype=dt)
        parts.append((f / f.norm(dim=-1, keepdim=True) * r).reshape(batch, -1))
    u = torch.cat(parts, -1)
    return x, u, ours.expmap(x, u), v


def reference_transport(blocks, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Parallel transport on every sphere factor from geoopt's log maps (geoopt's own ``transp`` projects):
    the unit vector along ``log_x y`` goes to the one along ``-log_y x``, the rest is unchanged."""
    import geoopt

    sphere, out, start = geoopt.Sphere(), [], 0
    for n, d in blocks:                        # one batched geoopt call per block of equal spheres
        xs, ys, vs = (t[..., start:start + n * d].reshape(*t.shape[:-1], n, d) for t in (x, y, v))
        a, b = sphere.logmap(xs, ys), -sphere.logmap(ys, xs)
        a, b = a / a.norm(dim=-1, keepdim=True), b / b.norm(dim=-1, keepdim=True)
        c = (vs * a).sum(-1, keepdim=True)
        out.append((vs - c * a + c * b).reshape(*x.shape[:-1], n * d))
        start += n * d
    return torch.cat(out, -1)


def check(blocks=BLOCKS, batch: int = 4, generator: torch.Generator | None = None) -> dict:
    """Assert that both libraries compute the same exp, log, dist (and parallel transport); returns the
    problem and the largest deviations."""
    gen = generator or torch.Generator().manual_seed(0)
    ours, peer = build(blocks)
    x, u, y, v = points(ours, batch, gen)
    errors = {"expmap": (ours.expmap(x, u) - peer.expmap(x, u)).abs().max().item(),
              "logmap": (ours.logmap(x, y) - peer.logmap(x, y)).abs().max().item(),
              "dist": (ours.dist(x, y) - peer.dist(x, y)).abs().max().item(),
              "transp": (ours.transp(x, y, v) - reference_transport(blocks, x, y, v)).abs().max().item()}
    assert errors["logmap"] < TOL and (ours.logmap(x, y) - u).abs().max() < TOL, errors   # log inverts exp
    for op, err in errors.items():
        assert err < TOL, f"{op}: wsbook and geoopt differ by {err:.2e} (> {TOL})"
    return dict(ours=ours, peer=peer, x=x, u=u, y=y, v=v, errors=errors)


def main(batch: int = 16) -> None:
    problem = check(batch=batch)
    ours, peer, x, u, y, v = (problem[k] for k in ("ours", "peer", "x", "u", "y", "v"))
    n = sum(n for n, _ in BLOCKS)
    print("name, ours, peer, ratio")
    calls = {"expmap": ((ours.expmap, peer.expmap), (x, u)), "logmap": ((ours.logmap, peer.logmap), (x, y)),
             "dist": ((ours.dist, peer.dist), (x, y)), "transp": ((ours.transp, peer.transp), (x, y, v))}
    for op, ((f_ours, f_peer), args) in calls.items():
        t_ours = best_seconds(lambda: f_ours(*args), repeats=5)
        t_peer = best_seconds(lambda: f_peer(*args), repeats=2)
        label = "transp (ours parallel, geoopt projection)" if op == "transp" else op
        print(f"manifolds_{label} {n} mixed spheres (batch {batch}), {t_ours:.5f}, {t_peer:.5f}, {t_peer / t_ours:.1f}")


if __name__ == "__main__":
    main()
