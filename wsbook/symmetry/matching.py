"""Alignment of networks up to permutation (and sign) symmetry: weight matching, activation matching,
Sinkhorn re-basin, sign-aware weight matching and variational (mean-field Gaussian) matching.

Every function aligns a population ``theta [B, D]`` to a reference ``theta_ref`` (``[D]``, ``[1, D]`` or
``[B, D]``, one reference per member) and returns an :class:`Alignment` (a :class:`GaussianAlignment` for
variational matching): the group element (see :mod:`wsbook.symmetry.actions`) and the aligned population,
with diagnostics. Which tensor axes each hidden layer's permutation acts on is read from
:func:`wsbook.symmetry.symmetry_spec` (Git Re-Basin's permutation spec), so MLPs and CNNs are aligned by the
same code. Cost matrices for the whole population are built with batched products; the only per-network
loop is the assignment solve itself (Jonker-Volgenant from the ``lap`` package, which has no batched form),
which runs on ``[width, width]`` matrices already computed. See chapter 5, "Alignment".
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import lap
import numpy as np
import torch
from torch import Tensor

from wsbook.loop import descend, make_optimizer
from wsbook.nets import NetSpec, check_task, per_member_loss
from wsbook.symmetry.actions import check_permutations, flip_signs, permute, permute_soft
from wsbook.symmetry.spec import symmetry_spec


# ------------------------------------------------------------------ results
@dataclass
class Alignment:
    """What every alignment method returns.

    Attributes:
        perms: one ``[B, width]`` LongTensor per hidden layer; new neuron ``i`` of member ``b`` is old neuron
            ``perms[l][b, i]`` (apply with :func:`wsbook.symmetry.permute`).
        aligned: the aligned population ``[B, D]`` (permuted, then sign-flipped when ``signs`` is given).
        signs: per hidden layer ``[B, width]`` of +-1 for the sign-aware methods, else ``None``.
        objective: ``[B]``, the matching objective of the returned element (weight matching: the summed inner
            product ``<theta_ref, aligned>``; larger is better), or ``None`` for methods without one.
        converged: ``[B]`` bool, weight matching only: the coordinate descent of the returned candidate
            reached a fixed point, a full sweep over all layers in which no layer's assignment (or sign)
            changed; ``False`` when it stopped at ``max_iter``. A fixed point is a local optimum with respect
            to single-layer updates, *not* a certificate of the global optimum (the restarts are what make a
            global optimum likely). ``None`` for methods that are not iterative.
        sweeps: the most sweeps over the layers any candidate needed (weight matching), else 0.
        candidates: how many starting points were optimised per member (weight matching), else 1.
        hungarian_seconds: time spent in Hungarian solves (summed over threads when they run in parallel).
        soft: Sinkhorn re-basin only: the doubly stochastic matrices ``[B, w, w]`` before hardening.
    """

    perms: list[Tensor]
    aligned: Tensor
    signs: list[Tensor] | None = None
    objective: Tensor | None = None
    converged: Tensor | None = None
    sweeps: int = 0
    candidates: int = 1
    hungarian_seconds: float = 0.0
    soft: list[Tensor] | None = None


@dataclass
class GaussianAlignment:
    """What :func:`variational_matching` returns: ``perms`` (as in :class:`Alignment`), the aligned ``mean``
    and ``std`` ``[B, D]``, and the diagnostics ``objective``, ``converged``, ``sweeps``, ``candidates`` of
    the underlying weight matching on means and standard deviations."""

    perms: list[Tensor]
    mean: Tensor
    std: Tensor
    objective: Tensor
    converged: Tensor
    sweeps: int = 0
    candidates: int = 1


# ------------------------------------------------------------------ helpers
def hungarian(cost: Tensor, maximize: bool = True) -> Tensor:
    """Solve ``[B, n, n]`` linear assignment problems; returns ``perm [B, n]`` with row ``i`` assigned to
    column ``perm[i]``.

    Each matrix is solved by the Jonker-Volgenant algorithm of the ``lap`` package (``lapjv``): on the
    weight-matching costs of 128-neuron layers it takes less than half the time of SciPy's
    ``linear_sum_assignment`` (``benchmarks/bench_peer_alignment.py``). Both return an optimum; they agree
    wherever it is unique."""
    if cost.dim() == 2:
        cost = cost.unsqueeze(0)
    if cost.dim() != 3 or cost.shape[1] != cost.shape[2]:
        raise ValueError(f"cost must be [B, n, n]; got {tuple(cost.shape)}")
    c = cost.detach().to("cpu", torch.float64).numpy()
    if not np.isfinite(c).all():
        raise FloatingPointError("assignment cost contains NaN or inf")
    signed = np.ascontiguousarray(-c if maximize else c)
    out = np.empty(c.shape[:2], dtype=np.int64)
    for b in range(c.shape[0]):     # no batched LAP solver exists: the one per-network loop
        out[b] = lap.lapjv(signed[b], extend_cost=False, return_cost=False)[0]
    return torch.from_numpy(out).to(cost.device)


def _pair(spec: NetSpec, theta_ref: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
    """Validate a reference and a population for alignment and broadcast the reference."""
    ref = spec.check(theta_ref, "theta_ref")
    theta = spec.check(theta, "theta")
    if ref.shape[0] not in (1, theta.shape[0]):
        raise ValueError(f"theta_ref must be one network ([D] or [1, D]) or one per member ([{theta.shape[0]}, D]); "
                         f"got {ref.shape[0]} references for {theta.shape[0]} networks")
    return ref.to(theta), theta


def _check_spec(spec: NetSpec) -> None:
    symmetry_spec(spec)          # raises a TypeError for anything that is not a network spec
    if spec.n_layers < 2:
        raise ValueError(f"{spec} has no hidden layer, so there is nothing to align")


def _shape_along(ndim: int, axis: int, n: int, width: int) -> list[int]:
    shape = [1] * ndim
    shape[0], shape[axis] = n, width
    return shape


#: bytes of one member's largest parameter tensor times the members per block of cost matrices on a CPU
CPU_BLOCK_BYTES = 1 << 20
#: most bytes kept per layer for the cost terms that no other layer changes (one ``[B, w, w]`` per layer)
FIXED_BYTES = 1 << 26


class _Matcher:
    """Coordinate descent of weight matching (Ainsworth et al., 2023, Alg. 1) over ``K`` candidate starting
    points for each of ``B`` members at once (``K * B`` rows; row ``r`` is candidate ``r // B`` of member
    ``r % B``), summed over parameter 'channels' (e.g. means and standard deviations), driven by the axes of
    the symmetry spec. With ``signs`` every hidden neuron also carries a sign flip (odd activations)."""

    def __init__(self, spec: NetSpec, refs: list[Tensor], others: list[Tensor], signs: bool, K: int):
        self.spec, self.signs = spec, signs
        self.sym = symmetry_spec(spec)
        self.groups = self.sym.groups
        self.acting = self.sym.acting_on
        self.B, self.K = others[0].shape[0], K
        self.dev, self.dtype = others[0].device, others[0].dtype
        self.refs = [self._views(r) for r in refs]
        self.others = [self._views(t) for t in others]
        # a single reference's tensors with each acted-on axis first, [1, width, rest], for every cost matrix
        self.ref_moved = [[[ref[(ax.kind, ax.layer)].movedim(ax.dim + 1, 1).reshape(1, g.width, -1)
                            if ref[(ax.kind, ax.layer)].shape[0] == 1 else None for ref in self.refs]
                           for ax in g.axes] for g in self.groups]
        self.n_rows = self.K * self.B
        self.perms = [torch.arange(g.width, device=self.dev).expand(self.n_rows, g.width).clone() for g in self.groups]
        self.sgn = [torch.ones(self.n_rows, g.width, device=self.dev, dtype=self.dtype) for g in self.groups]
        self.hungarian_seconds = 0.0
        # groups acting on a common tensor: a layer's cost matrix changes only when one of these changes
        self.neighbours = [sorted({g for acting in self.acting.values() if h in acting.values()
                                   for g in acting.values()} - {h}) for h in range(len(self.groups))]
        # On a CPU the cost matrices are built a few members at a time, so that each block's gathered weights
        # and products stay in cache (about 1 MiB): three times faster than one product over a whole zoo
        # of 128-wide layers (benchmarks/bench_peer_alignment.py). A GPU takes all rows in one product.
        per_member = max(t[0].numel() for views in self.others for t in views.values()) * others[0].element_size()
        self.block = self.n_rows if self.dev.type != "cpu" else max(1, CPU_BLOCK_BYTES // per_member)
        # the leading terms of a layer's cost that no other group acts on (the first layer's incoming weights,
        # a bias) are the same at every visit: summed once per member, in the order cost() sums them
        self.flat = others
        self.fixed = [self._fixed(h) for h in range(len(self.groups))]

    def _views(self, theta: Tensor) -> dict[tuple[str, int], Tensor]:
        out = {("W", l): w for l, w in enumerate(self.spec.weights(theta))}
        out.update({("b", l): b for l, b in enumerate(self.spec.biases(theta)) if b is not None})
        return out

    def _apply_others(self, t: Tensor, key: tuple[str, int], skip: int, perms: dict[int, Tensor],
                      sgn: dict[int, Tensor]) -> Tensor:
        """``t [n, ...]`` (member rows of one parameter tensor) with the current elements ``perms`` (and
        ``sgn``) of the rows of every group acting on it except ``skip`` applied (permutation, then sign)."""
        for dim, h in self.acting.get(key, {}).items():
            if h == skip:
                continue
            shape = _shape_along(t.dim(), dim + 1, t.shape[0], self.groups[h].width)
            if dim == 0:    # whole rows: indexing copies them (about 3x faster than an elementwise gather)
                t = t[torch.arange(t.shape[0], device=t.device)[:, None], perms[h]]
            else:
                t = t.gather(dim + 1, perms[h].reshape(shape).expand(t.shape))
            if self.signs:
                t = t * sgn[h].reshape(shape)
        return t

    def _fixed(self, h: int) -> tuple[int, Tensor | None]:
        """How many leading axes of group ``h`` are acted on by ``h`` alone, and their summed cost ``[B, w, w]``."""
        lead = 0
        for ax in self.groups[h].axes:
            if len(self.acting[(ax.kind, ax.layer)]) > 1:
                break
            lead += 1
        w = self.groups[h].width
        if lead == 0 or self.B * w * w * self.flat[0].element_size() > FIXED_BYTES:     # else recomputed per visit
            return 0, None
        return lead, self._terms(h, torch.arange(self.B, device=self.dev), lambda t: t, None, range(lead))

    def _terms(self, h: int, rows: Tensor, take: Callable[[Tensor], Tensor], known: set[int] | None, axes: range,
               cost: Tensor | None = None) -> Tensor | None:
        """``cost`` plus the products of the axes ``axes`` of group ``h`` (see :meth:`cost`)."""
        n, w = rows.shape[0], self.groups[h].width
        perms = {g: self.perms[g][rows] for g in self.neighbours[h]}
        sgn = {g: self.sgn[g][rows] for g in self.neighbours[h]} if self.signs else {}
        for i in axes:
            ax = self.groups[h].axes[i]
            key = (ax.kind, ax.layer)
            if known is not None and any(g != h and g not in known for g in self.acting[key].values()):
                continue
            for ref, moved, other in zip(self.refs, self.ref_moved[h][i], self.others):
                if moved is not None:
                    r = moved.expand(n, -1, -1)
                else:
                    r = take(ref[key])
                    r = r.movedim(ax.dim + 1, 1).reshape(r.shape[0], w, -1)
                t = self._apply_others(take(other[key]), key, h, perms, sgn)
                t = t.movedim(ax.dim + 1, 1).reshape(t.shape[0], w, -1)
                cost = torch.bmm(r, t.transpose(1, 2)) if cost is None else cost.baddbmm_(r, t.transpose(1, 2))
        return cost

    def cost(self, h: int, rows: Tensor, known: set[int] | None = None) -> Tensor:
        """``[n, w, w]``: ``C[i, j]`` is the objective gained by placing old neuron ``j`` at position ``i`` of
        hidden layer ``h`` for the given rows (ascending), with all other groups at their current elements.
        With ``known``, only tensors whose other acted-on axes all belong to groups in ``known`` contribute
        (the greedy initialisation, where later layers are not yet assigned)."""
        n, w = rows.shape[0], self.groups[h].width
        if n == 0:
            return torch.zeros(0, w, w, device=self.dev, dtype=self.dtype)
        if self.B == 1:        # every row is a candidate of the one member: a broadcast view, no host sync
            take = lambda t: t[:1].expand(n, *t.shape[1:])  # noqa: E731
        else:
            lo, hi = rows[[0, -1]].tolist()
            # a range of rows within one candidate (the usual case) takes a view of the population, not a copy
            same = hi - lo == n - 1 and lo // self.B == hi // self.B
            index = slice(lo % self.B, lo % self.B + n) if same else rows % self.B
            take = lambda t: t[index]  # noqa: E731
        lead, fixed = self.fixed[h]
        cost = None if fixed is None else take(fixed).clone()
        cost = self._terms(h, rows, take, known, range(lead, len(self.groups[h].axes)), cost)
        if cost is None:
            return torch.zeros(n, w, w, device=self.dev, dtype=self.dtype)
        return cost

    def moved(self, rows: Tensor) -> list[Tensor]:
        """Each channel's networks of ``rows`` with their current elements applied, ``[n, D]`` (the same
        gathers as :func:`permute` and :func:`flip_signs`, without their validation)."""
        perms = {g: p[rows] for g, p in enumerate(self.perms)}
        sgn = {g: s[rows] for g, s in enumerate(self.sgn)} if self.signs else {}
        out = []
        for theta in self.flat:
            moved = theta[rows % self.B]
            for key, t in self._views(moved).items():
                if key in self.acting:
                    t.copy_(self._apply_others(t, key, -1, perms, sgn))
            out.append(moved)
        return out

    def update(self, jobs: list[tuple[int, Tensor, set[int] | None]]) -> list[Tensor]:
        """One exact assignment step for each job ``(layer h, rows, known)`` (see :meth:`cost`); the jobs
        of one step touch disjoint rows, so they are solved together. Returns which rows of each job changed."""
        def solve(h: int, block: Tensor, known: set[int] | None) -> tuple[Tensor, Tensor | None, float]:
            cost = self.cost(h, block, known)
            t0 = time.perf_counter()
            new = hungarian(cost.abs() if self.signs else cost)
            seconds = time.perf_counter() - t0
            if not self.signs:
                return new, None, seconds
            picked = cost.gather(2, new.unsqueeze(2)).squeeze(2)
            return new, torch.where(picked < 0, -1.0, 1.0).to(self.dtype), seconds

        tasks = [(h, block, known) for h, rows, known in jobs
                 for block in (rows.split(self.block) if rows.numel() > self.block else (rows,))]
        workers = min(torch.get_num_threads(), len(tasks))
        if workers > 1 and sum(rows.numel() for _, rows, _ in jobs) > self.block:
            # the cost of the next block is built by torch (which releases the GIL) while earlier blocks'
            # LAPs are solved
            with ThreadPoolExecutor(workers) as pool:
                solved = list(pool.map(lambda task: solve(*task), tasks))
        else:          # each block's LAPs are solved while its cost matrices are still in cache
            solved = [solve(*task) for task in tasks]
        self.hungarian_seconds += sum(sec for _, _, sec in solved)
        changes, done = [], 0
        for h, rows, _ in jobs:
            n_blocks = -(-rows.numel() // self.block)
            parts, done = solved[done:done + n_blocks], done + n_blocks
            new = parts[0][0] if n_blocks == 1 else torch.cat([p for p, _, _ in parts])
            changed = (new != self.perms[h][rows]).any(1)
            self.perms[h][rows] = new
            if self.signs:
                new_sgn = parts[0][1] if n_blocks == 1 else torch.cat([sg for _, sg, _ in parts])
                changed |= (new_sgn != self.sgn[h][rows]).any(1)
                self.sgn[h][rows] = new_sgn
            changes.append(changed)
        return changes

    def greedy(self, starts: list[tuple[Tensor, list[int]]]) -> None:
        """Greedy passes ``(rows, order)``, all in step: each assigns the layers one after another in its
        ``order``, each from the tensors whose other axes are already assigned. Left to right this matches
        every neuron by its incoming weights given the previous layer (as layer-wise OT fusion does, Singh &
        Jaggi, 2020), which recovers an exact permuted copy in one pass."""
        for step in range(len(self.groups)):
            self.update([(order[step], rows, set(order[:step])) for rows, order in starts])

    def descend(self, max_iter: int, fixed: Tensor, generator: torch.Generator | None) -> tuple[Tensor, int]:
        """Coordinate descent from the current elements. Each sweep visits the layers in the order ``fixed[k]``
        (``[K_fixed, L]``) for the first candidates and in a fresh random order for the others (shared by all
        members, so a member's result does not depend on the batch). A row stops when a full sweep changes
        nothing. A layer whose neighbours (the groups acting on the same tensors) have not changed since it
        was last solved for a row would get the same cost matrix and the same assignment again, so it is
        skipped: the answer is that of the plain algorithm, with fewer Hungarian solves (its last, unchanging
        sweep costs nothing). At each step all rows (every candidate of every member) are solved together,
        grouped by the layer they visit. Returns ``(converged [K*B], sweeps)``."""
        L = len(self.groups)
        # the bookkeeping is a few booleans per row: host arrays, far cheaper per step than tensor operations
        active = np.ones(self.n_rows, dtype=bool)
        stale = np.ones((L, self.n_rows), dtype=bool)                              # [layer, row]: must solve
        candidate, row = np.arange(self.n_rows) // self.B, np.arange(self.n_rows)
        sweeps = 0
        while sweeps < max_iter and active.any():
            sweeps += 1
            order = fixed
            if self.K > fixed.shape[0]:
                random = torch.rand(self.K - fixed.shape[0], L, generator=generator).argsort(1)
                order = torch.cat([fixed, random])
            visits = order.numpy()[candidate]                                       # [K*B, L]
            changed = np.zeros(self.n_rows, dtype=bool)
            for step in range(L):
                visit = visits[:, step]                                             # [K*B]
                due = active & stale[visit, row]
                layers = np.bincount(visit[due], minlength=L).nonzero()[0].tolist()
                rows = [np.flatnonzero(due & (visit == h)) for h in layers]
                jobs = [(h, torch.from_numpy(r).to(self.dev), None) for h, r in zip(layers, rows)]
                for h, r, moved in zip(layers, rows, self.update(jobs)):
                    moved = moved.cpu().numpy()
                    changed[r] |= moved
                    stale[h, r] = False
                    for g in self.neighbours[h]:
                        stale[g, r[moved]] = True
            active &= changed
        return torch.from_numpy(~active).to(self.dev), sweeps


STARTS = ("forward", "backward", "identity")

#: bytes of moved candidates scored in one call at the end of weight matching
SCORE_BYTES = 1 << 26


def _match(spec: NetSpec, refs: list[Tensor], others: list[Tensor], *, signs: bool, max_iter: int, restarts: int,
           generator: torch.Generator | None, init: list[Tensor] | None, starts: Sequence[str] = STARTS) -> dict:
    """Weight matching from several starts; returns the best candidate of every member and the diagnostics."""
    if not isinstance(max_iter, int) or max_iter < 0:
        raise ValueError(f"max_iter must be a non-negative integer; got {max_iter!r}")
    if not isinstance(restarts, int) or restarts < 0:
        raise ValueError(f"restarts must be a non-negative integer; got {restarts!r}")
    starts = tuple(starts)
    if not starts or len(set(starts)) != len(starts) or not set(starts) <= set(STARTS):
        raise ValueError(f"starts must be distinct names from {STARTS}; got {starts!r}")
    widths = symmetry_spec(spec).widths
    B, L = others[0].shape[0], len(widths)
    if init is not None:
        if "identity" not in starts:
            raise ValueError("init replaces the 'identity' start; include 'identity' in starts")
        if len(init) != L:
            raise ValueError(f"init needs one permutation per hidden layer ({L}); got {len(init)}")
        init = [torch.as_tensor(p, device=others[0].device).reshape(-1, w).expand(B, w) for p, w in zip(init, widths)]
        check_permutations(init, widths, "init")
    # candidates: the named starts in order (greedy passes, identity or init), then the random restarts
    K = len(starts) + restarts
    m = _Matcher(spec, refs, others, signs, K)
    rows = lambda k: torch.arange(k * B, (k + 1) * B, device=m.dev)  # noqa: E731
    ascending = torch.arange(L)
    orders, greedy = [], []
    for k, name in enumerate(starts):
        order = ascending.flip(0) if name == "backward" else ascending
        if name != "identity":
            greedy.append((rows(k), order.tolist()))
        elif init is not None:
            for h in range(L):
                m.perms[h][rows(k)] = init[h].long()
        orders.append(order)
    m.greedy(greedy)
    # random starts: a deterministic start relabelled by a random element Q_k (shared by all members). As a
    # start this is as random as a uniform permutation, but when it is relabelled from a greedy solution the
    # starting *network* does not depend on how theta's neurons happen to be ordered (equivariance).
    anchor = next((k for k, name in enumerate(starts) if name != "identity"), 0)
    for k in range(len(starts), K):
        for h, w in enumerate(widths):
            q = torch.rand(1, w, generator=generator).argsort(1).to(m.dev).expand(B, w)
            m.perms[h][rows(k)] = m.perms[h][rows(anchor)].gather(1, q)
            if signs:
                flips = (torch.rand(1, w, generator=generator) < 0.5).to(m.dtype).to(m.dev) * 2 - 1
                m.sgn[h][rows(k)] = m.sgn[h][rows(anchor)].gather(1, q) * flips
    converged, sweeps = m.descend(max_iter, torch.stack(orders), generator)
    # every candidate is moved and scored, as many at once as SCORE_BYTES allows; the best so far is kept,
    # moved, so that the winner need not be permuted a second time
    member = torch.arange(B, device=m.dev)
    per_call = max(1, SCORE_BYTES // (B * sum(t[0].numel() * t.element_size() for t in others)))
    for first in range(0, K, per_call):
        n = min(per_call, K - first)
        moved = [t.view(n, B, -1) for t in m.moved(torch.arange(first * B, (first + n) * B, device=m.dev))]
        objective, pick = sum((ref * t).sum(2) for ref, t in zip(refs, moved)).max(0)   # the first of equals
        moved = [t[pick, member] for t in moved]
        if first == 0:
            best, best_objective, aligned = pick, objective, moved
            continue
        better = objective > best_objective      # strictly: the first of equally good candidates wins
        best = torch.where(better, pick + first, best)
        best_objective = torch.where(better, objective, best_objective)
        aligned = [torch.where(better[:, None], t, a) for t, a in zip(moved, aligned)]
    pick = best * B + member
    return {"perms": [p[pick] for p in m.perms], "signs": [s[pick] for s in m.sgn] if signs else None,
            "aligned": aligned, "objective": best_objective, "converged": converged[pick],
            "sweeps": sweeps, "candidates": K, "hungarian_seconds": m.hungarian_seconds}


# --------------------------------------------------------- weight matching
def weight_matching(spec: NetSpec, theta_ref: Tensor, theta: Tensor, *, max_iter: int = 100,
                    starts: Sequence[str] = STARTS, restarts: int = 0, generator: torch.Generator | None = None,
                    init: list[Tensor] | None = None) -> Alignment:
    """Weight matching (Ainsworth et al., 2023): find ``pi`` maximising ``sum_l <W_l^ref, P_l W_l P_{l-1}^T>
    + <b_l^ref, P_l b_l>`` by coordinate descent over layers with the Hungarian method.

    Coordinate descent stops at local optima, and on narrow deep networks a start at the identity often
    ends in one that is not the planted permutation of an exact copy. So every member is optimised from
    several starting points at once, and the one with the largest objective is returned: a greedy pass from
    the input layer (each layer matched by its incoming weights given the previous layer's match; this alone
    recovers an exact permuted copy), the same pass from the output layer, the identity (or ``init``), and
    ``restarts`` random relabellings of the greedy solution (``starts`` selects the deterministic ones). The
    deterministic candidates sweep the layers in a fixed order (input to output; output to input for the backward one), the random ones in a
    fresh random order per sweep; each stops when a full sweep changes nothing (see :class:`Alignment` for
    what ``converged`` certifies). With the default ``restarts=0`` the result is deterministic (the
    ``generator`` is not used); random restarts can raise the objective of unrelated networks a little more
    at proportional cost. Apart from the identity start, every candidate's starting network is the same
    for ``theta`` and for any permuted copy of it, so aligning an aligned population returns it unchanged.

    Aligns a whole zoo ``theta [B, D]`` to one reference ``[D]`` / ``[1, D]`` (or one reference per member)
    in a batch; the layer orders and random starts are shared by all members, so a member's result does not
    depend on the rest of the batch. Works for MLPs and CNNs. See chapter 5, "Alignment".

    Args:
        spec: the architecture.
        theta_ref: reference network(s).
        theta: population ``[B, D]`` to align.
        max_iter: most sweeps over the layers per candidate.
        starts: the deterministic starts, any of ``"forward"``, ``"backward"`` (greedy passes) and
            ``"identity"`` (the classic start of Ainsworth et al.; ``init`` when given).
        restarts: number of random starts in addition to the deterministic ones.
        generator: randomness of the layer orders and random starts (``None``: torch's global generator).
        init: a starting element (one ``[width]`` or ``[B, width]`` permutation per hidden layer) that replaces
            the identity candidate, e.g. the result of another method.
    """
    _check_spec(spec)
    ref, theta = _pair(spec, theta_ref, theta)
    out = _match(spec, [ref], [theta], signs=False, max_iter=max_iter, restarts=restarts, generator=generator,
                 init=init, starts=starts)
    return Alignment(perms=out["perms"], aligned=out["aligned"][0], objective=out["objective"],
                     converged=out["converged"], sweeps=out["sweeps"], candidates=out["candidates"],
                     hungarian_seconds=out["hungarian_seconds"])


def sign_aware_weight_matching(spec: NetSpec, theta_ref: Tensor, theta: Tensor, *, max_iter: int = 100,
                               starts: Sequence[str] = STARTS, restarts: int = 0,
                               generator: torch.Generator | None = None) -> Alignment:
    """Weight matching over permutations *and* sign flips, for odd activations (tanh, sine): the Hungarian
    method on ``|C|`` picks the permutation and ``sign(C[i, perm[i]])`` the flip (Boufalis et al., 2025).
    Same candidates and stopping rule as :func:`weight_matching` (the random starts also draw random signs).

    Returns an :class:`Alignment` with ``signs`` and ``aligned = flip_signs(permute(theta, perms), signs)``.

    Args:
        spec: the architecture (odd activation).
        theta_ref: reference network(s).
        theta: population ``[B, D]`` to align.
        max_iter: most sweeps over the layers per candidate.
        starts: the deterministic starts (see :func:`weight_matching`).
        restarts: number of random starting elements in addition to the deterministic ones.
        generator: randomness of the layer orders and random starts (``None``: torch's global generator).
    """
    _check_spec(spec)
    if symmetry_spec(spec).scaling != "sign":
        raise ValueError(f"sign-aware matching needs an odd activation (tanh, sine); {spec} uses {spec.activation}")
    ref, theta = _pair(spec, theta_ref, theta)
    out = _match(spec, [ref], [theta], signs=True, max_iter=max_iter, restarts=restarts, generator=generator,
                 init=None, starts=starts)
    return Alignment(perms=out["perms"], aligned=out["aligned"][0], signs=out["signs"],
                     objective=out["objective"], converged=out["converged"], sweeps=out["sweeps"],
                     candidates=out["candidates"], hungarian_seconds=out["hungarian_seconds"])


def variational_matching(spec: NetSpec, mean_ref: Tensor, std_ref: Tensor, mean: Tensor, std: Tensor, *,
                         max_iter: int = 100, restarts: int = 0,
                         generator: torch.Generator | None = None) -> GaussianAlignment:
    """Align mean-field Gaussians ``N(mean, diag(std^2))`` (Rossi et al., 2023): minimise the squared
    2-Wasserstein distance ``||mu_ref - P mu||^2 + ||sigma_ref - P sigma||^2`` over permutations, i.e. weight
    matching on means and standard deviations together (same candidates as :func:`weight_matching`).

    Args:
        spec: the architecture.
        mean_ref, std_ref: the reference Gaussian(s).
        mean, std: the population of Gaussians ``[B, D]`` to align.
        max_iter: most sweeps over the layers per candidate.
        restarts: number of random starting permutations in addition to the deterministic ones.
        generator: randomness of the layer orders and random starts (``None``: torch's global generator).
    """
    _check_spec(spec)
    mref, mean = _pair(spec, mean_ref, mean)
    sref, std = _pair(spec, std_ref, std)
    if std.shape != mean.shape:
        raise ValueError(f"mean and std must have the same shape; got {tuple(mean.shape)} and {tuple(std.shape)}")
    if bool((std < 0).any()) or bool((std_ref < 0).any()):
        raise ValueError("standard deviations must be non-negative")
    out = _match(spec, [mref, sref], [mean, std], signs=False, max_iter=max_iter, restarts=restarts,
                 generator=generator, init=None)
    return GaussianAlignment(perms=out["perms"], mean=out["aligned"][0], std=out["aligned"][1],
                             objective=out["objective"],
                             converged=out["converged"], sweeps=out["sweeps"], candidates=out["candidates"])


# ----------------------------------------------------- activation matching
def activation_statistics(spec: NetSpec, theta_ref: Tensor, theta: Tensor, x: Tensor, *,
                          batch_size: int = 512, statistic: str = "correlation") -> list[Tensor]:
    """Per hidden layer, the ``[B, w, w]`` similarity of reference neuron ``i`` and neuron ``j`` of each member,
    from post-activations streamed over data batches: ``inner`` = mean of ``h_ref_i h_j``, ``correlation`` =
    Pearson correlation (Li et al., 2016; Ainsworth et al., 2023). For a CNN every pixel of every image is
    one sample of a channel's activation.

    Args:
        spec: the architecture.
        theta_ref: reference network(s).
        theta: population ``[B, D]``.
        x: inputs ``[N, ...]``, streamed in batches of ``batch_size``.
        batch_size: inputs per forward pass.
        statistic: ``"correlation"`` or ``"inner"``.
    """
    if statistic not in ("inner", "correlation"):
        raise ValueError(f"statistic must be 'inner' or 'correlation'; got {statistic!r}")
    ref, theta = _pair(spec, theta_ref, theta)
    if x.dim() < 2 or x.shape[0] < 1:
        raise ValueError(f"x must be a batch of inputs [N, ...]; got {tuple(x.shape)}")
    L = spec.n_layers - 1
    cross = [0.0] * L
    s_ref, s, q_ref, q = [0.0] * L, [0.0] * L, [0.0] * L, [0.0] * L
    n = 0
    with torch.no_grad():
        for start in range(0, x.shape[0], batch_size):
            xb = x[start:start + batch_size].to(theta)
            _, h_ref = spec.forward(ref, xb, return_hidden=True)
            _, h = spec.forward(theta, xb, return_hidden=True)
            n += h[0].shape[1]
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


def activation_matching(spec: NetSpec, theta_ref: Tensor, theta: Tensor, x: Tensor, *, batch_size: int = 512,
                        statistic: str = "correlation", signs: bool = False) -> Alignment:
    """Activation matching (Ainsworth et al., 2023): match each hidden layer's neurons by the similarity of
    their post-activations on data (one Hungarian problem per layer; layers are independent because
    a network's hidden activations are a function of the network alone, only their order changes).

    With ``signs`` (tanh, sine) the Hungarian method runs on ``|C|`` and the sign of the matched entry gives
    the flip. Returns an :class:`Alignment` (``signs`` is ``None`` unless asked for).

    Args:
        spec: the architecture.
        theta_ref: reference network(s).
        theta: population ``[B, D]`` to align.
        x: inputs ``[N, ...]`` the activations are computed on.
        batch_size: inputs per streamed batch.
        statistic: ``"correlation"`` or ``"inner"``.
        signs: also match sign flips (odd activations).
    """
    _check_spec(spec)
    if signs and symmetry_spec(spec).scaling != "sign":
        raise ValueError(f"signs=True needs an odd activation (tanh, sine); {spec} uses {spec.activation}")
    ref, theta = _pair(spec, theta_ref, theta)
    stats = activation_statistics(spec, ref, theta, x, batch_size=batch_size, statistic=statistic)
    t0 = time.perf_counter()
    perms = [hungarian(c.abs() if signs else c) for c in stats]
    seconds = time.perf_counter() - t0
    aligned = permute(spec, theta, perms)
    if not signs:
        return Alignment(perms=perms, aligned=aligned, hungarian_seconds=seconds)
    flips = [torch.where(c.gather(2, p.unsqueeze(2)).squeeze(2) < 0, -1.0, 1.0).to(theta) for c, p in zip(stats, perms)]
    return Alignment(perms=perms, aligned=flip_signs(spec, aligned, flips), signs=flips, hungarian_seconds=seconds)


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


def sinkhorn_matching(spec: NetSpec, theta_ref: Tensor, theta: Tensor, x: Tensor | None = None,
                      y: Tensor | None = None, *, loss: str = "l2", steps: int = 200, lr: float = 0.1,
                      tau: float = 1.0, n_iter: int = 20, batch_size: int = 256, init: list[Tensor] | None = None,
                      init_strength: float = 5.0, task: str = "classification",
                      generator: torch.Generator | None = None) -> Alignment:
    """Sinkhorn re-basin (Pena et al., 2023): learn score matrices ``M_l``, relax permutations to the doubly
    stochastic ``P_l = Sinkhorn(M_l / tau)``, apply them by batched products and minimise

    - ``l2``: ``||theta_ref - P(theta)||^2`` (no data);
    - ``midpoint``: the task loss of ``(theta_ref + P(theta)) / 2`` on data batches;
    - ``random``: the task loss of ``(1 - lam) theta_ref + lam P(theta)``, ``lam ~ U(0, 1)`` per step.

    All members are optimised at once (one Adam over ``[B, w, w]`` leaves). The result is hardened with the
    Hungarian method on ``P_l``; the soft matrices are returned in ``soft``.

    Args:
        spec: the architecture.
        theta_ref: reference network(s).
        theta: population ``[B, D]`` to align.
        x, y: data for the ``midpoint`` and ``random`` losses.
        loss: ``"l2"``, ``"midpoint"`` or ``"random"``.
        steps, lr: Adam steps and learning rate on the scores.
        tau: Sinkhorn temperature; n_iter: Sinkhorn iterations per step.
        batch_size: data points per step.
        init: starting permutations (e.g. weight matching's); scores start at ``init_strength`` times
            their one-hot matrices.
        task: ``"classification"`` (cross-entropy) or ``"regression"`` (squared error) for the data losses.
        generator: randomness of the score initialisation, data batches and ``lam`` (``None``: torch's
            global generator).
    """
    _check_spec(spec)
    check_task(task)
    if loss not in SINKHORN_LOSSES:
        raise ValueError(f"loss must be one of {SINKHORN_LOSSES}; got {loss!r}")
    if loss != "l2" and (x is None or y is None):
        raise ValueError(f"the {loss!r} Sinkhorn loss needs data x and y")
    if tau <= 0 or steps < 0:
        raise ValueError(f"need tau > 0 and steps >= 0; got tau={tau}, steps={steps}")
    ref, theta = _pair(spec, theta_ref, theta)
    B, widths = theta.shape[0], symmetry_spec(spec).widths
    if init is not None:
        init = [torch.as_tensor(p, device=theta.device).reshape(-1, w).expand(B, w) for p, w in zip(init, widths)]
        check_permutations(init, widths, "init")
    scores = []
    for h, w in enumerate(widths):
        m = 1e-3 * torch.randn(B, w, w, generator=generator).to(theta)
        if init is not None:
            m = m + init_strength * torch.nn.functional.one_hot(init[h].long(), w).to(theta)
        scores.append(m.requires_grad_(True))
    ref_b = ref.expand(B, -1)

    def objective(step: int) -> Tensor:
        moved = permute_soft(spec, theta, [sinkhorn(m / tau, n_iter) for m in scores])
        if loss == "l2":
            return ((ref_b - moved) ** 2).sum()
        idx = torch.randint(0, x.shape[0], (min(batch_size, x.shape[0]),), generator=generator).to(x.device)
        lam = 0.5 if loss == "midpoint" else torch.rand(B, 1, generator=generator).to(theta)
        return per_member_loss(spec, (1 - lam) * ref_b + lam * moved, x[idx], y[idx], task).sum()

    if steps:
        descend(objective, make_optimizer(scores, "adam", lr=lr), steps, desc="Sinkhorn matching")
    with torch.no_grad():
        P = [sinkhorn(m / tau, n_iter) for m in scores]
    t0 = time.perf_counter()
    perms = [hungarian(p) for p in P]
    seconds = time.perf_counter() - t0
    return Alignment(perms=perms, aligned=permute(spec, theta, perms), hungarian_seconds=seconds, soft=P)
