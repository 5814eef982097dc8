"""Weight-space learning on neural graphs (Kofinas et al., 2024; thesis ``000`` ch. 5).

* :class:`NeuralGraph` turns a spec (:class:`~wsbook.nets.MLPSpec` or :class:`~wsbook.nets.CNNSpec`) into a graph
  structure once; populations ``[B, D]`` become batched graphs by gathering and come back by scattering.
* :class:`PNAEdgeLayer`, :class:`RelationalTransformerLayer`, :class:`FourierTime`: layers.
* :class:`WeightSpaceGNN` (invariant or equivariant head), :class:`FlatMLP` baseline.
* :mod:`wsbook.graphs.train`: model zoos and generalization prediction (Kendall tau, R^2).
* :mod:`wsbook.graphs.align`: a learned, equivariant aligner (DEEP-ALIGN style) and its comparison with
  weight matching and Sinkhorn re-basin.
* :mod:`wsbook.graphs.inr`: SIREN zoos of digit images and the canonicalizing autoencoder.
* :mod:`wsbook.graphs.plot`: drawing a network as its neural graph.

Permutations and sign flips of neurons come from :mod:`wsbook.symmetry` (the one group action).
"""
from wsbook.graphs.layers import FourierTime, PNAEdgeLayer, RelationalTransformerLayer
from wsbook.graphs.models import FlatMLP, WeightSpaceGNN, count_parameters
from wsbook.graphs.neural_graph import GraphBatch, NeuralGraph

__all__ = ["FourierTime", "PNAEdgeLayer", "RelationalTransformerLayer", "FlatMLP", "WeightSpaceGNN",
           "count_parameters", "GraphBatch", "NeuralGraph"]
