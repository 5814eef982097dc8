"""Bayesian deep learning on populations: priors, likelihoods, inference methods, model averaging, metrics."""
from wsbook.bayes.metrics import (accuracy, agreement, bma, brier, ece, nll, predictive_probs,
                                  total_variation)
from wsbook.bayes.model import GaussianPrior, LogPosterior, log_likelihood
from wsbook.bayes.vi import MeanFieldPosterior, fit_mean_field, fit_vi

__all__ = ["accuracy", "agreement", "bma", "brier", "ece", "nll", "predictive_probs", "total_variation",
           "GaussianPrior", "LogPosterior", "log_likelihood", "MeanFieldPosterior", "fit_mean_field", "fit_vi"]
