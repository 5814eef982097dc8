"""The book's method: flows over neural-network weights (book chapter 7; thesis chapter 6).

* :mod:`~wsbook.weightflow.charts`: Euclidean, Normalized and Geometric charts (networks <-> points of a
  manifold, sources with exact log-densities, weight-space vectors -> tangent vectors).
* :mod:`~wsbook.weightflow.fields`: vector fields over weights ``field(t, x)``, each a :class:`WeightField`
  (the protocol the flow saves, anchors and transfers by): the equivariant GNN
  (:func:`gnn_field`), the field whose nodes read whole hidden neurons, for MLPs of any depth
  (:class:`NeuronField`) and the flat-MLP baseline
  (:class:`FlatField`, which also reads a CNN's flat vector).
* :mod:`~wsbook.weightflow.cnn_fields`: :class:`ChannelField`, the field of the neuron-field family over the
  hidden channels of a CNN (:class:`~wsbook.nets.CNNSpec`; the charts and :class:`WeightFlow` take a CNNSpec
  as they take an MLPSpec).
* :mod:`~wsbook.weightflow.flow`: :class:`WeightFlow` (fit, sample, log_prob, state_dict / from_state,
  with_spec) and the reference code's sampler, kept to measure its error.
* :mod:`~wsbook.weightflow.variational`: a flow trained on an unnormalised log-density (reverse KL, with or
  without samples of the target), :func:`~wsbook.weightflow.variational.fit_reverse_kl`.
* :mod:`~wsbook.weightflow.guidance`: task-loss guidance for the whole population at once.
* :mod:`~wsbook.weightflow.checkpoints`: a directory of ordinary PyTorch MLP ``state_dict`` files in
  (:func:`load_checkpoints`), sampled networks back out as such files (:func:`save_checkpoints`).

Imports ``nets``, ``manifolds``, ``flows``, ``symmetry`` and ``graphs``; never ``bayes``, the plotting
package or ``experiments``: the populations it learns from are handed to it.
"""
from wsbook.weightflow.charts import (Chart, EuclideanChart, GeometricChart, NormalizedChart, chart_from_config,
                                      make_chart, spec_config, split_spec_config)
from wsbook.weightflow.checkpoints import CheckpointError, load_checkpoints, save_checkpoints
from wsbook.weightflow.fields import (FIELDS, FlatField, GNNField, NeuronField, WeightField,
                                      field_from_config, gnn_field)
from wsbook.weightflow.cnn_fields import ChannelField
from wsbook.weightflow.flow import FitResult, WeightFlow, reference_sample, sample_times
from wsbook.weightflow.guidance import Guidance, task_gradient

__all__ = ["Chart", "EuclideanChart", "NormalizedChart", "GeometricChart", "make_chart", "chart_from_config",
           "spec_config", "split_spec_config", "ChannelField", "WeightField", "FIELDS", "GNNField", "gnn_field", "FlatField", "NeuronField", "field_from_config", "WeightFlow", "FitResult",
           "reference_sample", "sample_times", "Guidance", "task_gradient", "load_checkpoints", "save_checkpoints",
           "CheckpointError"]
