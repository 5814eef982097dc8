"""The trained zoos and models of chapters 5 (symmetries) and 6 (weight-space learning), at the chapters'
settings per scale. Every function here returns cached results, and every entry of :data:`RUNS` is one of
them with its arguments: the chapters call them, and ``python -m wsbook chapter/05 chapter/06`` makes the
same calls, so that after the command line the chapters train nothing they cache.

The settings (widths, pair counts, training steps) grow with the scale (:func:`wsbook.config.by_scale`);
each docstring gives them as ``ci / default / full``.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from torch import Tensor, nn

from wsbook import data
from wsbook.cache import cached
from wsbook.config import by_scale
from wsbook.experiments import alignment, zoos
from wsbook.experiments.graphs import generalization_benchmark as fit_predictors, split_by_seed, trained_model
from wsbook.graphs import FlatMLP, WeightSpaceGNN
from wsbook.nets import CNNSpec, MLPSpec

# ------------------------------------------------------------------------------------------ chapter 5


def digit_mlp_pairs() -> tuple[MLPSpec, Tensor]:
    """Independently trained digit MLPs ``64-w-w-w-10`` (w = 64 / 128 / 128), 2 x 3 / 8 / 32 of them, each
    trained 400 / 1,500 / 3,000 steps: the first half is paired with the second. Returns ``(spec, theta)``."""
    width = by_scale(ci=64, default=128, full=128)
    spec = MLPSpec((64, width, width, width, 10))
    n_pairs = by_scale(ci=3, default=8, full=32)
    return spec, zoos.train_zoo(spec, "digits", 2 * n_pairs, steps=by_scale(ci=400, default=1500, full=3000))


def digit_cnn_pairs() -> tuple[CNNSpec, Tensor]:
    """Independently trained digit CNNs with 16-16 / 32-32 / 64-64-64 channels, 2 x 2 / 6 / 16 of them, each
    trained 300 / 800 / 3,000 steps: the first half is paired with the second. Returns ``(spec, theta)``."""
    spec = CNNSpec(1, by_scale(ci=(16, 16), default=(32, 32), full=(64, 64, 64)), n_classes=10)
    n_pairs = by_scale(ci=2, default=6, full=16)
    return spec, zoos.train_cnn_zoo(spec, 2 * n_pairs, steps=by_scale(ci=300, default=800, full=3000))


def width_sweep() -> dict[str, Tensor]:
    """Barriers against hidden width (:func:`wsbook.experiments.alignment.width_sweep`): widths 8-32-128 /
    4 to 256 / 4 to 512 (powers of two), 2 / 4 / 8 pairs per width trained 300 / 1,000 / 2,000 steps."""
    widths = by_scale(ci=[8, 32, 128], default=[4, 8, 16, 32, 64, 128, 256],
                      full=[4, 8, 16, 32, 64, 128, 256, 512])
    return alignment.width_sweep(widths, n_pairs=by_scale(ci=2, default=4, full=8),
                                 steps=by_scale(ci=300, default=1000, full=2000))


def variational_samples() -> int:
    """Weight samples per point of a path between variational posteriors: 16 / 32 / 128."""
    return by_scale(ci=16, default=32, full=128)


def _variational_pairs_settings() -> dict[str, int]:
    return {"n_pairs": by_scale(ci=2, default=4, full=8), "steps": by_scale(ci=800, default=3000, full=6000)}


def variational_pairs() -> tuple[MLPSpec, dict[str, Tensor]]:
    """Mean-field posteriors of digit MLPs ``64-w-w-10`` (w = 32 / 64 / 128), 2 x 2 / 4 / 8 of them, each
    fitted 800 / 3,000 / 6,000 steps (:func:`wsbook.experiments.zoos.fit_variational_zoo`): the first half is
    paired with the second. Returns ``(spec, {"mean", "std", ...})``."""
    width = by_scale(ci=32, default=64, full=128)
    spec = MLPSpec((64, width, width, 10))
    s = _variational_pairs_settings()
    return spec, zoos.fit_variational_zoo(spec, "digits", 2 * s["n_pairs"], steps=s["steps"])


def variational_width_sweep() -> dict[str, Tensor]:
    """Barriers between variational posteriors against width (widths 8-32-128 / 8 to 128 / 8 to 256), with
    the pairs and steps of :func:`variational_pairs` and :func:`variational_samples` samples."""
    widths = by_scale(ci=[8, 32, 128], default=[8, 16, 32, 64, 128], full=[8, 16, 32, 64, 128, 256])
    return alignment.variational_width_sweep(widths, **_variational_pairs_settings(),
                                             n_samples=variational_samples())


#: the hidden width of :func:`variational_prior_sweep`
VARIATIONAL_PRIOR_WIDTH = 32


def variational_prior_sweep() -> dict[str, Tensor]:
    """Barriers between variational posteriors against the prior's standard deviation (0.3-1-3 / 0.1 to 3 /
    0.1 to 3) and the temperature (0.1-1-3 / 0.03 to 3 / 0.03 to 3), at width
    :data:`VARIATIONAL_PRIOR_WIDTH`, with the pairs and steps of :func:`variational_pairs`."""
    return alignment.variational_prior_sweep(
        by_scale(ci=[0.3, 1.0, 3.0], default=[0.1, 0.3, 1.0, 3.0], full=[0.1, 0.3, 1.0, 3.0]),
        by_scale(ci=[0.1, 1.0, 3.0], default=[0.03, 0.1, 0.3, 1.0, 3.0], full=[0.03, 0.1, 0.3, 1.0, 3.0]),
        width=VARIATIONAL_PRIOR_WIDTH, **_variational_pairs_settings(), n_samples=variational_samples())


def siren_pairs() -> tuple[MLPSpec, dict[str, Tensor]]:
    """SIRENs ``2-w-w-1`` (w = 32 / 64 / 128, frequency 30) of one 2-D shape, 3 / 6 / 16 of each kind, fitted
    800 / 3,000 / 5,000 steps (:func:`wsbook.experiments.zoos.fit_inr_pairs`). Returns ``(spec, nets)``."""
    width = by_scale(ci=32, default=64, full=128)
    spec = MLPSpec((2, width, width, 1), activation="sine", frequency=30.0)
    return spec, zoos.fit_inr_pairs(spec, by_scale(ci=3, default=6, full=16),
                                    steps=by_scale(ci=800, default=3000, full=5000))


def hyper_matching() -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Hyper-matching between SIRENs of :func:`siren_pairs` with different initialisations, on 3 / 3 / 16
    pairs, trained 300 / 500 / 2,000 steps. Returns ``(theta_a, theta_b, matched)``."""
    spec, nets = siren_pairs()
    n = by_scale(ci=3, default=3, full=16)
    a, b = nets["a"][:n], nets["diff"][:n]
    return a, b, alignment.hyper_matching(spec, a, b, steps=by_scale(ci=300, default=500, full=2000))


def moons_zoo() -> tuple[MLPSpec, Tensor]:
    """Two-moons classifiers ``2-16-16-2``, 8 / 32 / 128 of them, trained 400 / 1,500 / 3,000 steps at
    learning rate 0.01. Returns ``(spec, theta)``."""
    spec = MLPSpec((2, 16, 16, 2))
    return spec, zoos.train_zoo(spec, "moons", by_scale(ci=8, default=32, full=128),
                                steps=by_scale(ci=400, default=1500, full=3000), lr=1e-2)


# ------------------------------------------------------------------------------------------ chapter 6


def generalization_zoo() -> dict[str, Any]:
    """Chapter 6's zoo for predicting generalization (:func:`wsbook.experiments.zoos.digits_zoo`): hidden
    widths 4, 8 and 16, learning rates 1e-3 and 3e-3 (and 3e-4 at default and full), 4 / 6 / 10 seeds,
    200 / 400 / 1,000 steps with 4 checkpoints per run, on images average-pooled by ``zoo["pool"]``
    (2 / 2 / 1)."""
    pool = by_scale(ci=2, default=2, full=1)
    zoo = zoos.digits_zoo(hidden_widths=(4, 8, 16),
                          lrs=by_scale(ci=(1e-3, 3e-3), default=(3e-4, 1e-3, 3e-3), full=(3e-4, 1e-3, 3e-3)),
                          n_seeds=by_scale(ci=4, default=6, full=10), steps=by_scale(ci=200, default=400, full=1000),
                          n_checkpoints=4, pool=pool)
    return {**zoo, "pool": pool}


def predictor_settings() -> dict[str, Any]:
    """The models that predict a network's test accuracy from its weights, and their training: PNA and the
    relational transformer over the neural graph (width 16 / 32 / 64, 2 / 3 / 4 layers, learning rate 3e-3),
    an MLP of hidden width 64 over the flattened weights and the same MLP on randomly permuted copies of the
    networks (learning rate 1e-3), each trained 20 / 80 / 200 epochs."""
    return {"dim": by_scale(ci=16, default=32, full=64), "n_layers": by_scale(ci=2, default=3, full=4),
            "mlp_hidden": 64, "epochs": by_scale(ci=20, default=80, full=200),
            "lr": {"pna": 3e-3, "relational_transformer": 3e-3, "mlp": 1e-3, "mlp_augmented": 1e-3},
            "augmented": ["mlp_augmented"]}


def generalization_benchmark() -> dict[str, Any]:
    """The models of :func:`predictor_settings` trained on :func:`generalization_zoo`'s training runs and scored
    on its held-out runs (:func:`wsbook.experiments.graphs.generalization_benchmark`), cached."""
    return _generalization_benchmark(generalization_zoo(), predictor_settings())


@cached("models/generalization", version=1)
def _generalization_benchmark(zoo: dict, settings: dict) -> dict:
    spec, s = MLPSpec(tuple(zoo["widths"])), settings
    models = {**{layer: functools.partial(WeightSpaceGNN, spec, layer, dim=s["dim"], n_layers=s["n_layers"])
                 for layer in ("pna", "relational_transformer")},
              **{name: functools.partial(FlatMLP, spec.n_params, s["mlp_hidden"]) for name in ("mlp", "mlp_augmented")}}
    return fit_predictors(zoo, models, epochs=s["epochs"], lr=s["lr"], augmented=s["augmented"])


@dataclasses.dataclass(frozen=True)
class AlignerData:
    """The learned aligner's networks: ``fit`` (the first three quarters of the zoo) trains it, ``held_out``
    tests it; ``x_fit`` / ``x_eval`` are the digits' training / test images pooled to 4 x 4, and
    ``test_accuracy`` is every network's accuracy on ``x_eval``."""

    spec: MLPSpec
    fit: Tensor
    held_out: Tensor
    x_fit: Tensor
    y_fit: Tensor
    x_eval: Tensor
    y_eval: Tensor
    test_accuracy: Tensor


def aligner_data() -> AlignerData:
    """Digit classifiers ``16-16-16-10`` on 4 x 4 images, one checkpoint of each of 48 / 512 / 512 runs
    (300 steps, learning rate 3e-3), split for the learned aligner (:class:`AlignerData`)."""
    zoo = zoos.digits_zoo(hidden_widths=(16,), lrs=(3e-3,), n_seeds=by_scale(ci=48, default=512, full=512),
                          steps=300, n_checkpoints=1, pool=2)
    nets, digits = zoo["theta"], data.load("digits")
    cut = int(0.75 * len(nets))
    return AlignerData(MLPSpec(tuple(zoo["widths"])), nets[:cut], nets[cut:], zoos.pooled_digits(digits.x_train, 2),
                       digits.y_train, zoos.pooled_digits(digits.x_test, 2), digits.y_test, zoo["test_accuracy"])


def aligner_build() -> dict[str, Any]:
    """The learned aligner's architecture: a relational transformer of 2 layers, width 16 / 32 / 32."""
    return {"dim": by_scale(ci=16, default=32, full=32), "n_layers": 2, "layer": "relational_transformer"}


def aligner_fit() -> dict[str, Any]:
    """The learned aligner's training: 300 / 800 / 3,000 steps of 8 pairs at learning rate 3e-3, every
    planted copy with a noise standard deviation drawn from ``noise`` (0 to 0.8)."""
    return {"steps": by_scale(ci=300, default=800, full=3000), "batch_size": 8, "lr": 3e-3, "noise": (0.0, 0.8)}


def trained_aligner() -> tuple[nn.Module, Tensor]:
    """The learned aligner (:func:`aligner_build`) trained on :func:`aligner_data`'s ``fit`` networks with
    both losses (:func:`aligner_fit`, interpolation weight 1), from the initial weights of seed 0.
    Returns ``(aligner, history)``."""
    d = aligner_data()
    aligner, history, _ = trained_model("aligner", d.spec, d.fit, d.x_fit, d.y_fit, build=aligner_build(),
                                        lmc_weight=1.0, **aligner_fit())
    return aligner, history


def aligner_test_pairs(held_out: Tensor) -> tuple[Tensor, Tensor]:
    """The held-out pairs: the first half of ``held_out`` against the second (an odd one left out)."""
    half = len(held_out) // 2
    return held_out[:half], held_out[half:2 * half]


def aligner_objectives() -> dict[str, dict[str, float]]:
    """Aligners trained on one loss each, from the learned aligner's initial weights and on its pairs,
    scored on :func:`aligner_test_pairs` (:func:`wsbook.experiments.alignment.aligner_objectives`)."""
    d = aligner_data()
    return alignment.aligner_objectives(d.spec, d.fit, *aligner_test_pairs(d.held_out), d.x_fit, d.y_fit,
                                        d.x_eval, d.y_eval, objectives=("supervised", "interpolation"),
                                        **aligner_build(), **aligner_fit())


def shifted_zoo(shift: str) -> dict[str, Tensor]:
    """The held-out networks' counterpart on a shifted task (``alignment.SHIFTED_DIGITS``), trained from
    fresh initialisations with the recipe of :func:`aligner_data` (as many networks as its test pairs)."""
    d = aligner_data()
    return alignment.shifted_digits_zoo(shift, 2 * (len(d.held_out) // 2), hidden=d.spec.widths[1], steps=300,
                                        lr=3e-3, pool=2)


def cnn_alignment_spec() -> CNNSpec:
    """Chapter 6's digit CNNs: ReLU, 8-8 / 16-16 / 32-32 channels."""
    return CNNSpec(1, by_scale(ci=(8, 8), default=(16, 16), full=(32, 32)))


def cnn_alignment_zoo() -> tuple[CNNSpec, Tensor, Tensor]:
    """CNNs of :func:`cnn_alignment_spec`, 32 / 96 / 512 of them trained 300 / 800 / 3,000 steps; the last
    2 x 4 / 8 / 32 are held out for test pairs. Returns ``(spec, fit, held_out)``."""
    spec = cnn_alignment_spec()
    n_pairs = by_scale(ci=4, default=8, full=32)
    zoo = zoos.train_cnn_zoo(spec, by_scale(ci=32, default=96, full=512),
                             steps=by_scale(ci=300, default=800, full=3000))
    return spec, zoo[:-2 * n_pairs], zoo[-2 * n_pairs:]


def trained_cnn_aligner() -> tuple[nn.Module, Tensor]:
    """The learned aligner of :func:`trained_aligner`, on :func:`cnn_alignment_zoo`'s CNNs, its
    interpolation loss on 64 images per step. Returns ``(aligner, history)``."""
    spec, fit, _ = cnn_alignment_zoo()
    digits = data.load("digits")
    aligner, history, _ = trained_model("aligner", spec, fit, zoos.digit_images(digits.x_train), digits.y_train,
                                        build=aligner_build(), data_batch=64, **aligner_fit())
    return aligner, history


def _siren_zoo_settings() -> dict[str, Any]:
    return {"n_images": by_scale(ci=512, default=1024, full=1024), "hidden": 16, "frequency": 5.0,
            "steps": by_scale(ci=400, default=600, full=1500), "shared_init": True}


def siren_zoo() -> dict[str, Any]:
    """SIRENs ``2-16-16-1`` (frequency 5) of 512 / 1,024 / 1,024 digit images, fitted 400 / 600 / 1,500
    steps from one shared initialisation (:func:`wsbook.experiments.zoos.digit_inr_zoo`); the first
    :func:`siren_fit_count` train the autoencoder."""
    return zoos.digit_inr_zoo(**_siren_zoo_settings())


def siren_fit_count(zoo: dict[str, Any]) -> int:
    """How many SIRENs of ``zoo`` (:func:`siren_zoo`) train the autoencoder: the first 80 %."""
    return int(0.8 * len(zoo["images"]))


def siren_refit() -> dict[str, Any]:
    """The images of :func:`siren_zoo` fitted a second time, from another shared initialisation (seed 1)."""
    return zoos.digit_inr_zoo(**_siren_zoo_settings(), seed=1)


#: the initial-weight seeds of the SIREN autoencoders chapter 6 trains
SIREN_AUTOENCODER_SEEDS = (0, 1, 2)


def siren_autoencoder(init_seed: int = 0) -> tuple[nn.Module, Tensor]:
    """The SIREN autoencoder (PNA encoder of width 16 / 32 / 64, 2 layers, latent 32, decoder 256) trained
    30 / 60 / 200 epochs on :func:`siren_zoo`'s first :func:`siren_fit_count` networks, from the initial
    weights of ``init_seed``. Returns ``(autoencoder, history)``."""
    zoo = siren_zoo()
    n_fit = siren_fit_count(zoo)
    spec = MLPSpec(tuple(zoo["widths"]), activation="sine", frequency=zoo["frequency"])
    model, history, _ = trained_model(
        "weight_autoencoder", spec, zoo["theta"][:n_fit], zoo["images"][:n_fit], init_seed=init_seed,
        build={"dim": by_scale(ci=16, default=32, full=64), "n_layers": 2, "latent": 32, "decoder_hidden": 256},
        epochs=by_scale(ci=30, default=60, full=200), lr=2e-3, batch_size=32)
    return model, history


#: chapter 6's CNN autoencoders: (activation, encoder) -> whether hidden channels are canonicalized first
CNN_AUTOENCODERS = {("relu", "scale_canonical"): True, ("relu", "permutation_only"): False,
                    ("tanh", "sign_canonical"): True, ("tanh", "permutation_only"): False}


def cnn_checkpoint_zoos() -> dict[str, dict[str, Tensor]]:
    """By activation (ReLU, tanh): CNNs of :func:`cnn_alignment_zoo`'s architecture, 24 / 32 / 128 runs per
    learning rate, trained 300 / 600 / 1,500 steps and kept at 4 checkpoints
    (:func:`wsbook.experiments.zoos.cnn_checkpoint_zoo`); both have the same runs."""
    spec = cnn_alignment_spec()
    return {act: zoos.cnn_checkpoint_zoo(dataclasses.replace(spec, activation=act),
                                         by_scale(ci=24, default=32, full=128),
                                         steps=by_scale(ci=300, default=600, full=1500), n_checkpoints=4)
            for act in ("relu", "tanh")}


def cnn_autoencoder_split() -> tuple[Tensor, Tensor]:
    """Indices of :func:`cnn_checkpoint_zoos`' training and test networks: every checkpoint of the last
    4 / 6 / 16 seeds of each learning rate is a test network (one split serves both activations)."""
    return split_by_seed(cnn_checkpoint_zoos()["relu"]["seed"], by_scale(ci=4, default=6, full=16))


def cnn_autoencoder(activation: str, encoder: str) -> tuple[nn.Module, float]:
    """One of chapter 6's CNN autoencoders (a key of :data:`CNN_AUTOENCODERS`), trained 40 / 40 / 150 epochs on
    the training networks of its activation's :func:`cnn_checkpoint_zoos` (encoder width 16 / 32 / 64, latent
    32, decoder 256; the reconstruction's loss on 64 digit images per step). Returns ``(autoencoder, training
    seconds)``."""
    if (activation, encoder) not in CNN_AUTOENCODERS:
        raise ValueError(f"cnn_autoencoder: no autoencoder {(activation, encoder)}; one of {list(CNN_AUTOENCODERS)}")
    fit, _ = cnn_autoencoder_split()
    spec = dataclasses.replace(cnn_alignment_spec(), activation=activation)
    model, _, seconds = trained_model(
        "weight_autoencoder", spec, cnn_checkpoint_zoos()[activation]["theta"][fit],
        build={"dim": by_scale(ci=16, default=32, full=64), "latent": 32, "decoder_hidden": 256,
               "canonicalize": CNN_AUTOENCODERS[activation, encoder]},
        inputs=zoos.digit_images(data.load("digits").x_train), temperature=1.0, data_batch=64,
        epochs=by_scale(ci=40, default=40, full=150), lr=2e-3, batch_size=32)
    return model, seconds


def cnn_autoencoders() -> dict[tuple[str, str], tuple[nn.Module, float]]:
    """Every autoencoder of :data:`CNN_AUTOENCODERS` (:func:`cnn_autoencoder`): ``{(activation, encoder):
    (autoencoder, training seconds)}``."""
    return {key: cnn_autoencoder(*key) for key in CNN_AUTOENCODERS}


#: what ``python -m wsbook chapter/05`` and ``chapter/06`` compute: every run above, by chapter and name
RUNS: dict[str, dict[str, Callable[[], Any]]] = {
    "05": {"digit_mlp_pairs": digit_mlp_pairs, "digit_cnn_pairs": digit_cnn_pairs, "width_sweep": width_sweep,
           "variational_pairs": variational_pairs, "variational_width_sweep": variational_width_sweep,
           "variational_prior_sweep": variational_prior_sweep, "siren_pairs": siren_pairs,
           "hyper_matching": hyper_matching, "moons_zoo": moons_zoo},
    "06": {"generalization_zoo": generalization_zoo, "generalization_benchmark": generalization_benchmark,
           "trained_aligner": trained_aligner,
           "aligner_objectives": aligner_objectives,
           **{f"shifted_zoo_{s}": functools.partial(shifted_zoo, s) for s in alignment.SHIFTED_DIGITS},
           "trained_cnn_aligner": trained_cnn_aligner,
           **{f"siren_autoencoder_{s}": functools.partial(siren_autoencoder, s) for s in SIREN_AUTOENCODER_SEEDS},
           "siren_refit": siren_refit,
           # one artifact per autoencoder, so that `--jobs` trains them side by side
           **{f"cnn_autoencoder_{a}_{e}": functools.partial(cnn_autoencoder, a, e) for a, e in CNN_AUTOENCODERS}},
}
