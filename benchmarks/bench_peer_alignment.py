"""wsbook's batched weight matching against a pair-by-pair reference built only from NumPy and SciPy's
``linear_sum_assignment``, written as Git Re-Basin states it (Ainsworth et al., 2023, Algorithm 1).

The reference aligns one network ``B`` to the reference ``A`` by coordinate descent: every hidden layer's
permutation ``P_l`` starts at the identity; a sweep visits the hidden layers and solves, for each, the
linear assignment maximising ``<W_l^A, P_l W_l^B P_{l-1}^T> + <b_l^A, P_l b_l^B> + <W_{l+1}^A, P_{l+1}
W_{l+1}^B P_l^T>`` with the other permutations fixed; it stops after a sweep that changes nothing. The paper
visits the layers in a random order per sweep; both sides here use the input-to-output order, so that
the answers can be compared exactly. A zoo of 256 networks is aligned to one reference pair by pair (the
reference) and in one call of ``wsbook.symmetry.weight_matching(..., starts=("identity",))`` (ours, the
same algorithm from the same start for every member at once). Agreement: identical permutations.

Prints ``name, ours, peer, ratio`` lines (seconds; ratio = peer / ours, > 1 means wsbook is faster), and the
share of our time spent in the assignment solves themselves (one matrix at a time on both sides: SciPy's
``linear_sum_assignment`` for the reference, the Jonker-Volgenant solver of the ``lap`` package for ours).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from wsbook.nets import MLPSpec  # noqa: E402
from wsbook.symmetry import weight_matching  # noqa: E402


def rebasin_reference(weights_a: list[np.ndarray], biases_a: list[np.ndarray], weights_b: list[np.ndarray],
                      biases_b: list[np.ndarray], max_iter: int = 100) -> list[np.ndarray]:
    """Weight matching of one pair of MLPs (Git Re-Basin, Algorithm 1), layers visited input to output.

    ``weights_*[l]`` is ``[out, in]``, ``biases_*[l]`` is ``[out]``. Returns one permutation per hidden layer:
    new neuron ``i`` of ``B`` is its old neuron ``perm[i]``.
    """
    n_hidden = len(weights_a) - 1
    perms = [np.arange(w.shape[0]) for w in weights_a[:-1]]
    for _ in range(max_iter):
        changed = False
        for l in range(n_hidden):
            w_b = weights_b[l] if l == 0 else weights_b[l][:, perms[l - 1]]           # inputs permuted by P_{l-1}
            cost = weights_a[l] @ w_b.T + np.outer(biases_a[l], biases_b[l])
            w_next = weights_b[l + 1] if l + 1 == n_hidden else weights_b[l + 1][perms[l + 1]]   # outputs by P_{l+1}
            cost += weights_a[l + 1].T @ w_next
            new = linear_sum_assignment(cost, maximize=True)[1]
            if not np.array_equal(new, perms[l]):
                perms[l], changed = new, True
        if not changed:
            break
    return perms


def reference_zoo(spec: MLPSpec, ref: torch.Tensor, zoo: torch.Tensor) -> list[np.ndarray]:
    """The reference applied to every member of the zoo, one pair at a time: ``[B, width]`` per hidden layer."""
    wa = [w[0].numpy() for w in spec.weights(ref)]
    ba = [b[0].numpy() for b in spec.biases(ref)]
    out = []
    for i in range(zoo.shape[0]):
        member = zoo[i:i + 1]
        out.append(rebasin_reference(wa, ba, [w[0].numpy() for w in spec.weights(member)],
                                     [b[0].numpy() for b in spec.biases(member)]))
    return [np.stack([p[l] for p in out]) for l in range(spec.n_layers - 1)]


def problem(widths=(64, 128, 128, 128, 10), zoo_size: int = 256, seed: int = 0):
    """A reference network and a zoo (float64, independent initialisations)."""
    spec = MLPSpec(tuple(widths))
    gen = torch.Generator().manual_seed(seed)
    return spec, spec.init(1, generator=gen, dtype=torch.float64), spec.init(zoo_size, generator=gen, dtype=torch.float64)


def ours(spec, ref, zoo):
    return weight_matching(spec, ref, zoo, starts=("identity",))


def check(widths=(64, 128, 128, 128, 10), zoo_size: int = 256) -> dict:
    """Assert identical permutations; returns both results and the times of this (first) run."""
    spec, ref, zoo = problem(widths, zoo_size)
    t0 = time.perf_counter()
    mine = ours(spec, ref, zoo)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = reference_zoo(spec, ref, zoo)
    t_peer = time.perf_counter() - t0
    for l, (p, q) in enumerate(zip(mine.perms, theirs)):
        same = (p.numpy() == q).all(1)
        assert same.all(), f"hidden layer {l}: {int((~same).sum())} of {zoo_size} members get another permutation"
    return dict(ours=mine, peer=theirs, t_ours=t_ours, t_peer=t_peer)


def main(repeats: int = 2) -> None:
    widths, zoo_size = (64, 128, 128, 128, 10), 256
    result = check(widths, zoo_size)
    spec, ref, zoo = problem(widths, zoo_size)
    t_ours, t_peer, lap = result["t_ours"], result["t_peer"], result["ours"].hungarian_seconds
    for _ in range(repeats - 1):            # the check was the first run of both; keep the fastest
        t0 = time.perf_counter()
        r = ours(spec, ref, zoo)
        if time.perf_counter() - t0 < t_ours:
            t_ours, lap = time.perf_counter() - t0, r.hungarian_seconds
        t0 = time.perf_counter()
        reference_zoo(spec, ref, zoo)
        t_peer = min(t_peer, time.perf_counter() - t0)
    print("name, ours, peer, ratio")
    print(f"weight_matching zoo of {zoo_size} {widths} to one reference, {t_ours:.3f}, {t_peer:.3f}, {t_peer / t_ours:.2f}")
    print(f"weight_matching hungarian share of ours (sweeps {result['ours'].sweeps}), {lap:.3f}, {t_ours:.3f}, "
          f"{lap / t_ours:.2f}")


if __name__ == "__main__":
    main()
