"""Weight-space learning on neural graphs (Kofinas et al., 2024; thesis ``000`` ch. 5).

* :class:`NeuralGraph` turns a spec (:class:`~wsbook.nets.MLPSpec` or :class:`~wsbook.nets.CNNSpec`) into a graph
  structure once; populations ``[B, D]`` become batched graphs by gathering and come back by scattering.
  :class:`GraphBatch` batches graphs of one spec or, with ``from_populations``, of several specs of one family.
* :class:`PNAEdgeLayer`, :class:`PNALayer` (node-only), :class:`RelationalTransformerLayer`: layers (time enters through
  :class:`wsbook.flows.TimeEmbedding`).
* :class:`WeightSpaceGNN` (invariant or equivariant head, ``model(theta)``), :class:`WeightSpaceField`
  (the time-conditioned equivariant GNN as a vector field ``field(t, x)``), :class:`FlatMLP` baseline.
  None of them is tied to the width or depth of the spec it was built for.
* :mod:`wsbook.graphs.train`: predictors over weights and their metrics (Kendall tau, R^2).
* :mod:`wsbook.graphs.align`: a learned, equivariant aligner (DEEP-ALIGN style).
* :mod:`wsbook.graphs.inr`: rendering SIRENs and the canonicalizing autoencoder.

The book's zoos and benchmarks are in :mod:`wsbook.experiments`; the drawing of a neural graph is
:func:`wsbook.figures.draw_neural_graph`. Permutations and sign flips of neurons come from
:mod:`wsbook.symmetry` (the one group action).
"""
from wsbook.graphs.layers import DegreeScaledAggregation, PNAEdgeLayer, PNALayer, RelationalTransformerLayer
from wsbook.graphs.models import FlatMLP, WeightSpaceField, WeightSpaceGNN, count_parameters
from wsbook.graphs.neural_graph import ROLES, GraphBatch, NeuralGraph

__all__ = ["DegreeScaledAggregation", "PNAEdgeLayer", "PNALayer", "RelationalTransformerLayer", "FlatMLP",
           "WeightSpaceField", "WeightSpaceGNN", "count_parameters", "GraphBatch", "NeuralGraph", "ROLES"]
