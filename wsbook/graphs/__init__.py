"""Weight-space learning on neural graphs (Kofinas et al., 2024; thesis ``000`` ch. 5).

* :class:`NeuralGraph` turns a spec (:class:`~wsbook.nets.MLPSpec` or :class:`CNNSpec`) into a graph
  structure once; populations ``[B, D]`` become batched graphs by gathering and come back by scattering.
  :class:`GraphBatch` batches graphs of one spec or, with ``from_populations``, of several specs of one family.
* :class:`PNAEdgeLayer`, :class:`RelationalTransformerLayer`: layers (time enters through
  :class:`wsbook.flows.TimeEmbedding`).
* :class:`WeightSpaceGNN` (invariant or equivariant head, ``model(theta)``), :class:`WeightSpaceField`
  (the time-conditioned equivariant GNN as a vector field ``field(t, x)``), :class:`FlatMLP` baseline.
  None of them is tied to the width or depth of the spec it was built for.
* :mod:`wsbook.graphs.train`: model zoos and generalization prediction (Kendall tau, R^2).
* :mod:`wsbook.graphs.align`: a learned, equivariant aligner (DEEP-ALIGN style) and its comparison with
  weight matching and Sinkhorn re-basin.
* :mod:`wsbook.graphs.inr`: SIREN zoos of digit images and the canonicalizing autoencoder.
* :mod:`wsbook.graphs.plot`: drawing a network as its neural graph.
"""
from wsbook.graphs.cnn import CNNSpec
from wsbook.graphs.layers import DegreeScaledAggregation, PNAEdgeLayer, RelationalTransformerLayer
from wsbook.graphs.models import FlatMLP, WeightSpaceField, WeightSpaceGNN, count_parameters
from wsbook.graphs.neural_graph import ROLES, GraphBatch, NeuralGraph

__all__ = ["CNNSpec", "DegreeScaledAggregation", "PNAEdgeLayer", "RelationalTransformerLayer", "FlatMLP",
           "WeightSpaceField", "WeightSpaceGNN", "count_parameters", "GraphBatch", "NeuralGraph", "ROLES"]
