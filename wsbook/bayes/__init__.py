"""Bayesian deep learning on populations: priors, likelihoods, inference methods, model averaging, metrics."""
from wsbook.bayes.metrics import (accuracy, agreement, bma, brier, ece, nll, predictive_probs,
                                  total_variation)

__all__ = ["accuracy", "agreement", "bma", "brier", "ece", "nll", "predictive_probs", "total_variation"]
