"""Symmetries of neural network weights: group actions, alignment, canonicalization and linear mode
connectivity, all batched over populations ``[B, D]`` and driven by one declarative description of the
symmetry group of an architecture (:func:`symmetry_spec`), for MLPs and CNNs alike. This is the only
package that permutes, flips or rescales neurons. Chapter 5 of the book explains and uses it."""
from wsbook.symmetry.actions import (act_on_layer_, check_permutations, compose, flip_signs, function_difference,
                                     inverse_permutation, permute, permute_soft, random_permutation, random_scales,
                                     random_signs, scale)
from wsbook.symmetry.canonical import (canonicalize, from_spheres, neuron_norms, normalize_neurons, product_manifold,
                                       rescale_neurons, sign_canonicalize, sort_neurons, sphere_blocks,
                                       sphere_distance, to_spheres)
from wsbook.symmetry.lmc import (auc, barrier, connectivity, gaussian_interpolation_curve, interpolation_curve)
from wsbook.symmetry.matching import (Alignment, GaussianAlignment, activation_matching, activation_statistics,
                                      hungarian, sign_aware_weight_matching, sinkhorn, sinkhorn_matching,
                                      variational_matching, weight_matching)
from wsbook.symmetry.spec import SymmetrySpec, check_same_architecture, symmetry_spec

__all__ = [
    "SymmetrySpec", "symmetry_spec", "check_same_architecture",
    "random_permutation", "random_signs", "random_scales", "inverse_permutation", "compose", "check_permutations",
    "act_on_layer_", "permute", "permute_soft", "scale", "flip_signs", "function_difference",
    "Alignment", "GaussianAlignment",
    "hungarian", "weight_matching", "sign_aware_weight_matching", "variational_matching",
    "activation_statistics", "activation_matching", "sinkhorn", "sinkhorn_matching",
    "canonicalize", "neuron_norms", "normalize_neurons", "rescale_neurons", "sort_neurons", "sign_canonicalize",
    "sphere_blocks", "to_spheres",
    "from_spheres", "sphere_distance", "product_manifold",
    "interpolation_curve", "barrier", "auc", "connectivity", "gaussian_interpolation_curve",
]
