"""wsbook: the library behind the book on generative models over neural-network weights.

A population of networks is one ``[B, D]`` tensor laid out by a spec (:class:`wsbook.nets.MLPSpec`);
every module works on whole populations at once. Importing it changes no global state (plotly's
defaults, the allocator, the random seeds); chapters do that explicitly with
:func:`wsbook.experiments.setup_chapter`.
"""
from wsbook import config
from wsbook.config import by_scale, device, scale, seed_everything

__version__ = "0.1.0"
__all__ = ["config", "by_scale", "device", "scale", "seed_everything", "__version__"]
