"""The one table of published numbers the book is measured against, keyed by source.

Chapters read these numbers from here and show them in columns labelled "published"; they are never
computed by the book and never typed again anywhere else. Row names use the book's vocabulary (the
method names of :mod:`wsbook.experiments.alignment`, the flow names of the method chapters), so a
chapter can put a computed table and a published one side by side by name.

>>> from wsbook.experiments import published
>>> published.table("navon2024/mlp_alignment").get("weight_matching", "mnist_barrier")
0.047
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class PublishedTable:
    """Numbers of one table (or figure) of one source.

    Attributes:
        source: the bibliography key of the source (``book/references.bib``).
        where: where in the source (``"Table 1"``, ``"Figure 7.5, read off the figure"``).
        description: what was measured, on which data and architecture.
        columns: column names (``"<metric>"`` and ``"<metric>_std"`` for a reported standard deviation).
        rows: row name -> one value per column.
        note: caveats that matter when comparing with the book's numbers.
    """

    source: str
    where: str
    description: str
    columns: tuple[str, ...]
    rows: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        for name, values in self.rows.items():
            if len(values) != len(self.columns):
                raise ValueError(f"row {name!r} of {self.source} {self.where} has {len(values)} values for "
                                 f"{len(self.columns)} columns {self.columns}")

    def get(self, row: str, column: str, default: float | None = None) -> float:
        """One number; an unknown row gives ``default`` when one is given (e.g. ``nan`` for a method the
        source did not run), otherwise a ``KeyError`` naming the known rows. Unknown columns always raise."""
        if column not in self.columns:
            raise KeyError(f"{self.source} {self.where} has columns {self.columns}; got {column!r}")
        if row not in self.rows:
            if default is not None:
                return default
            raise KeyError(f"{self.source} {self.where} has rows {tuple(self.rows)}; got {row!r}")
        return self.rows[row][self.columns.index(column)]

    def column(self, column: str) -> dict[str, float]:
        """``{row: value}`` of one column."""
        return {row: self.get(row, column) for row in self.rows}

    def frame(self):
        """The table as a pandas DataFrame (rows by name)."""
        import pandas as pd

        return pd.DataFrame.from_dict(dict(self.rows), orient="index", columns=list(self.columns))


_FLOW = ("accuracy", "accuracy_std", "loss", "loss_std")

TABLES: dict[str, PublishedTable] = {
    # ------------------------------------------------------------- DEEP-ALIGN (paper 001)
    "navon2024/mlp_alignment": PublishedTable(
        "navon2024equivariant", "Table 1",
        "Barrier and AUC of the test loss along the segment after aligning pairs of MLP classifiers "
        "(3 hidden layers of width 128) on MNIST and CIFAR10.",
        ("mnist_barrier", "mnist_auc", "cifar10_barrier", "cifar10_auc"),
        {"naive": (2.007, 0.835, 0.927, 0.493),
         "weight_matching": (0.047, 0.011, 0.156, 0.068),
         "activation_matching": (0.024, 0.007, 0.066, 0.024),
         "sinkhorn": (0.027, 0.002, 0.183, 0.072),
         "wm_sinkhorn": (0.012, 0.000, 0.137, 0.050),
         "learned": (0.005, 0.000, 0.078, 0.029),               # DEEP-ALIGN
         "learned_sinkhorn": (0.000, 0.000, 0.037, 0.004)},     # DEEP-ALIGN + Sinkhorn
        note="One Sinkhorn variant; measured on a GPU with networks far larger than the book's ci scale."),
    "navon2024/cnn_alignment": PublishedTable(
        "navon2024equivariant", "Table 2",
        "Barrier and AUC of the test loss along the segment after aligning pairs of CNN image classifiers "
        "(7 convolutions of 16 to 128 channels with max pooling, then a linear layer) on CIFAR10 and STL10.",
        ("cifar10_barrier", "cifar10_barrier_std", "cifar10_auc", "cifar10_auc_std",
         "stl10_barrier", "stl10_barrier_std", "stl10_auc", "stl10_auc_std"),
        {"naive": (1.124, 0.01, 0.524, 0.00, 1.006, 0.00, 0.650, 0.00),
         "weight_matching": (0.661, 0.02, 0.178, 0.01, 0.859, 0.00, 0.453, 0.00),
         "activation_matching": (0.238, 0.01, 0.000, 0.00, 0.479, 0.00, 0.250, 0.00),
         "sinkhorn": (0.313, 0.01, 0.000, 0.00, 0.366, 0.00, 0.163, 0.00),
         "wm_sinkhorn": (0.333, 0.01, 0.000, 0.00, 0.371, 0.00, 0.165, 0.00),
         "learned": (0.237, 0.01, 0.000, 0.00, 0.382, 0.01, 0.182, 0.00),           # DEEP-ALIGN
         "learned_sinkhorn": (0.081, 0.00, 0.000, 0.00, 0.232, 0.00, 0.097, 0.00)},  # DEEP-ALIGN + Sinkhorn
        note="32x32 colour images and far deeper networks than the book's 8x8 digit CNNs; one Sinkhorn "
             "variant. The runtimes of the same table are in navon2024/cnn_runtime."),
    "navon2024/cnn_runtime": PublishedTable(
        "navon2024equivariant", "Table 2",
        "Wall-clock seconds to align one pair of CIFAR10 CNN image classifiers, averaged over 1,000 pairs "
        "(one RTX 2080 Ti GPU).",
        ("seconds_per_pair",),
        {"weight_matching": (0.21,), "activation_matching": (7.52,), "sinkhorn": (79.81,),
         "wm_sinkhorn": (80.02,), "learned": (0.44,), "learned_sinkhorn": (80.25,)}),
    "navon2024/ood_alignment": PublishedTable(
        "navon2024equivariant", "Table 3",
        "Barrier and AUC of the test loss along the segment after aligning pairs of CNN image classifiers "
        "trained on rotated CIFAR10 (every image turned by an angle drawn from -45 to 45 degrees) and on "
        "STL10, with a DEEP-ALIGN network trained on CIFAR10 CNNs only (out of distribution); the other "
        "methods are optimised on the new pairs and data.",
        ("rotated_barrier", "rotated_barrier_std", "rotated_auc", "rotated_auc_std",
         "stl10_barrier", "stl10_barrier_std", "stl10_auc", "stl10_auc_std"),
        {"naive": (1.077, 0.01, 0.714, 0.00, 1.006, 0.00, 0.650, 0.00),
         "weight_matching": (0.945, 0.02, 0.550, 0.01, 0.859, 0.00, 0.453, 0.00),
         "activation_matching": (0.586, 0.00, 0.336, 0.00, 0.479, 0.00, 0.250, 0.00),
         "sinkhorn": (0.596, 0.01, 0.321, 0.00, 0.366, 0.00, 0.163, 0.00),
         "learned": (0.769, 0.01, 0.453, 0.00, 0.686, 0.01, 0.373, 0.01),           # DEEP-ALIGN
         "learned_sinkhorn": (0.430, 0.01, 0.245, 0.00, 0.357, 0.00, 0.165, 0.00)},  # DEEP-ALIGN + Sinkhorn
        note="CNNs on 32x32 and 96x96 colour images; the book's shifted tasks are 4x4 digit MLPs. The STL10 "
             "rows of the other methods repeat Table 2."),
    "navon2024/objectives": PublishedTable(
        "navon2024equivariant", "Table 6 (appendix)",
        "Test barrier after DEEP-ALIGN trained with different objectives: the supervised loss on planted "
        "permutations with the interpolation (LMC) loss, with the L2 distance between the aligned weight "
        "vectors (the paper's alignment loss, written l2 here), or with both.",
        ("mnist_mlp_barrier", "cifar10_mlp_barrier", "cifar10_inr_barrier"),
        {"both": (0.007, 0.070, 0.063),             # supervised + interpolation
         "supervised_l2": (0.061, 0.343, 0.127),    # supervised + alignment (L2)
         "both_l2": (0.005, 0.078, 0.087)},         # supervised + interpolation + alignment (L2)
        note="Means over 3 seeds (every standard deviation reported as 0.00). The paper trains no aligner on "
             "one objective alone; its Table 1 DEEP-ALIGN uses all three losses."),
    # ------------------------------------------------------ autoencoder canonicalization (paper 004)
    "boufalis2025/inr_reconstruction": PublishedTable(
        "boufalis2025symmetry", "Table 1",
        "Pixel MSE of INRs decoded by a symmetry-invariant autoencoder (28x28 MNIST SIRENs).",
        ("train_mse", "test_mse"),
        {"scalegmn": (0.0096, 0.0106), "neural_graphs": (0.0068, 0.0135)},
        note="Larger images, larger networks and far longer training than the book's 8x8 digits."),
    "boufalis2025/cnn_reconstruction": PublishedTable(
        "boufalis2025symmetry", "Table 2 (the CNN table; the INR table is their Table 1)",
        "Held-out CNNs of the SmallCNN Zoo (CIFAR-10, three 3x3 convolutions of 16 channels, average pooling) "
        "and their reconstructions by a symmetry-invariant autoencoder: mean absolute difference of CIFAR-10 "
        "test accuracy (l1_error) and Kendall's tau between the two accuracy vectors.",
        ("l1_error", "kendall_tau"),
        {"scalegmn_relu": (0.0111, 0.9100), "neural_graphs_relu": (0.0142, 0.8914),
         "scalegmn_tanh": (0.0090, 0.9160), "neural_graphs_tanh": (0.0113, 0.8905)},
        note="About 6,000 training and 7,500 test networks of CIFAR-10 classifiers with accuracies spread by "
             "varied hyperparameters; the book's zoo is small CNNs on 8x8 digits, spread by training length."),
    # -------------------------------------------------- flows over weights (thesis 000, arXiv 2504.03710)
    "erdogan2025/breast_cancer": PublishedTable(
        "erdogan2025geometric", "Table 7.1",
        "Test accuracy and cross-entropy (mean +- std over generated networks) of MLPs 30-16-16-2 "
        "(802 parameters) sampled from flows trained on 100 Adam runs on Breast Cancer Wisconsin.",
        _FLOW,
        {"euclidean": (0.998, 0.006, 0.101, 0.050),
         "euclidean_aligned": (0.998, 0.006, 0.070, 0.040),
         "euclidean_aligned_ot": (0.993, 0.010, 0.053, 0.028),
         "normalized": (0.993, 0.009, 0.027, 0.014),
         "normalized_aligned": (0.989, 0.011, 0.030, 0.015),
         "normalized_aligned_ot": (0.988, 0.018, 0.044, 0.047),
         "geometric": (0.992, 0.011, 0.019, 0.009),
         "geometric_aligned": (0.993, 0.001, 0.018, 0.001),
         "geometric_aligned_ot": (0.991, 0.011, 0.020, 0.012),
         "target": (0.992, 0.010, 0.048, 0.032)},
        note="57 test points (one error is 0.0175 accuracy)."),
    "erdogan2025/breast_cancer_barrier": PublishedTable(
        "erdogan2025geometric", "Figure 7.2",
        "Loss barrier at the midpoint between pairs of the Adam-trained target networks (Breast Cancer).",
        ("barrier", "barrier_std"),
        {"unaligned": (0.244, 0.009), "aligned": (0.070, 0.001)}),
    "erdogan2025/mnist": PublishedTable(
        "erdogan2025geometric", "Table 7.2",
        "Test accuracy, cross-entropy and diversity (mean +- std over generated networks) of MNIST MLPs "
        "784-10-10 (7,960 parameters) sampled from flows trained on aligned SGD checkpoints.",
        _FLOW + ("diversity", "diversity_std"),
        {"euclidean_aligned": (0.737, 0.085, 0.814, 0.286, 0.00102, 0.00114),
         "euclidean_aligned_ot": (0.757, 0.077, 0.753, 0.245, 0.00085, 0.00094),
         "normalized_aligned": (0.753, 0.074, 1.537, 0.046, 0.00086, 0.00055),
         "normalized_aligned_ot": (0.706, 0.078, 1.608, 0.047, 0.00117, 0.00074),
         "geometric_aligned": (0.737, 0.070, 1.457, 0.040, 0.00073, 0.00049),
         "geometric_aligned_ot": (0.786, 0.064, 1.443, 0.046, 0.00093, 0.00063),
         "target": (0.933, 0.009, 0.231, 0.027, 0.00002, 0.00001)},
        note="The Normalized and Geometric losses were computed on networks whose last layer was rescaled, "
             "so they are on another logit scale than the Euclidean and Target losses; accuracies compare."),
    "erdogan2025/mnist_bma": PublishedTable(
        "erdogan2025geometric", "Figure 7.5 (read off the figure)",
        "Test accuracy of the Bayesian model average of 64 MNIST networks: flow samples with OT coupling, "
        "and 64 SGD checkpoints (target).",
        ("accuracy",),
        {"geometric_aligned_ot": (0.942,), "euclidean_aligned_ot": (0.939,), "normalized_aligned_ot": (0.911,),
         "target": (0.962,)},
        note="Approximate: read off a figure, not reported as numbers."),
    "erdogan2025/fashion_guidance": PublishedTable(
        "erdogan2025geometric", "Table 7.3",
        "Fashion-MNIST test accuracy and cross-entropy of samples of the MNIST flows with task-gradient "
        "guidance (lambda = 0.1, 512 Euler steps), against Adam-trained networks and one flow without guidance.",
        _FLOW,
        {"adam": (0.908, 0.003, 0.334, 0.008),
         "euclidean_guided": (0.754, 0.082, 0.764, 0.252),
         "normalized_guided": (0.724, 0.081, 1.543, 0.045),
         "geometric_guided": (0.730, 0.067, 1.470, 0.043),
         "no_guidance": (0.080, 0.030, 9.601, 1.402)}),
    "erdogan2025/width_transfer": PublishedTable(
        "erdogan2025geometric", "Table 7.4",
        "MNIST test accuracy and cross-entropy of MLPs 784-32-10 sampled from flows trained on 784-10-10 "
        "weights (architecture transfer), without and with guidance.",
        _FLOW,
        {"euclidean": (0.826, 0.076, 0.830, 0.281),
         "euclidean_guided": (0.842, 0.079, 0.796, 0.337),
         "geometric": (0.890, 0.030, 1.030, 0.038),
         "geometric_guided": (0.886, 0.033, 1.031, 0.037),
         "normalized": (0.203, 0.122, 2.652, 0.667),
         "normalized_guided": (0.184, 0.083, 2.776, 0.575)}),
}


def table(key: str) -> PublishedTable:
    """The published table ``key`` (one of :data:`TABLES`), with a clear error for an unknown key."""
    if key not in TABLES:
        raise KeyError(f"no published table {key!r}; available: {', '.join(TABLES)}")
    return TABLES[key]


def get(key: str, row: str, column: str, default: float | None = None) -> float:
    """Shorthand for ``table(key).get(row, column, default)``."""
    return table(key).get(row, column, default)

