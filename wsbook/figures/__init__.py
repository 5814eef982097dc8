"""Every figure of the book, over one shared style (:mod:`wsbook.figures.style`): a method keeps its
colour in every chapter. Importing this package changes nothing in plotly; :func:`setup` registers the
book's template and renderer (chapters call it through :func:`wsbook.experiments.setup_chapter`).

* :mod:`~wsbook.figures.style`: template, colours, renderer, general helpers (bands, heatmap grids, 3-D scenes).
* :mod:`~wsbook.figures.bayes`: sampled functions, regression bands, entropy maps (chapter 2).
* :mod:`~wsbook.figures.flows`: trajectories, geometry and samples on the sphere (chapters 3 and 4).
* :mod:`~wsbook.figures.symmetry`: neurons on the sphere (chapter 5).
* :mod:`~wsbook.figures.graphs`: a network drawn as its neural graph (chapter 6).
* :mod:`~wsbook.figures.results`: first layers as images, per-network accuracies, principal components of
  weights, predictive scatter and reliability diagrams, flows' training curves and the accuracy of their
  samples along training (chapter 8's result pages).
"""
from wsbook.figures.bayes import entropy_maps, function_samples, regression_panels
from wsbook.figures.flows import sphere_geometry, sphere_samples, trajectories_2d
from wsbook.figures.graphs import aligner_learning_curves, draw_neural_graph
from wsbook.figures.results import (accuracy_along_training, accuracy_histograms, first_layer_images, neuron_tiles,
                                    pca_projection, pca_scatter, predictive_scatter, relative_losses, reliability,
                                    reliability_diagram, training_curves)
from wsbook.figures.style import (METHOD_COLORS, METHOD_LABELS, PALETTE, SERIES_COLORS, TEMPLATE, BookRenderer, color,
                                  curves_with_bands, heatmap_grid, label, rgba, scene3d, setup, sphere_surface)
from wsbook.figures.symmetry import neurons_on_sphere

__all__ = [
    "METHOD_COLORS", "METHOD_LABELS", "SERIES_COLORS", "label", "PALETTE", "TEMPLATE", "BookRenderer", "color", "rgba", "setup",
    "curves_with_bands", "heatmap_grid", "scene3d", "sphere_surface",
    "function_samples", "regression_panels", "entropy_maps",
    "trajectories_2d", "sphere_geometry", "sphere_samples",
    "neurons_on_sphere", "draw_neural_graph", "aligner_learning_curves",
    "neuron_tiles", "first_layer_images", "accuracy_along_training", "accuracy_histograms", "pca_projection",
    "pca_scatter", "predictive_scatter", "reliability", "reliability_diagram", "relative_losses", "training_curves",
]
