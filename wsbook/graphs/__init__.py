"""Weight-space learning on neural graphs (Kofinas et al., 2024; thesis ``000`` ch. 5).

* :class:`NeuralGraph` turns a spec (:class:`~wsbook.nets.MLPSpec` or :class:`CNNSpec`) into a graph
  structure once; populations ``[B, D]`` become batched graphs by gathering and come back by scattering.
* :class:`PNAEdgeLayer`, :class:`RelationalTransformerLayer`, :class:`FourierTime`: layers.
* :class:`WeightSpaceGNN` (invariant or equivariant head), :class:`FlatMLP` baseline.
* :mod:`wsbook.graphs.train`: predictors over weights and their metrics (Kendall tau, R^2).
* :mod:`wsbook.graphs.align`: a learned, equivariant aligner (DEEP-ALIGN style).
* :mod:`wsbook.graphs.inr`: rendering SIRENs and the canonicalizing autoencoder.

The book's zoos and benchmarks are in :mod:`wsbook.experiments`; the drawing of a neural graph is
:func:`wsbook.figures.draw_neural_graph`.
"""
from wsbook.graphs.cnn import CNNSpec
from wsbook.graphs.layers import FourierTime, PNAEdgeLayer, RelationalTransformerLayer
from wsbook.graphs.models import FlatMLP, WeightSpaceGNN, count_parameters
from wsbook.graphs.neural_graph import GraphBatch, NeuralGraph

__all__ = ["CNNSpec", "FourierTime", "PNAEdgeLayer", "RelationalTransformerLayer", "FlatMLP", "WeightSpaceGNN",
           "count_parameters", "GraphBatch", "NeuralGraph"]
