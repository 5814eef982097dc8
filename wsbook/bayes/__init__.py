"""Bayesian deep learning on populations: priors, likelihoods, inference methods, model averaging, metrics.

Every method is driven by one signature, ``log_posterior(theta[B, D], batch) -> [B]``
(:class:`LogPosterior`, the tempered posterior ``p_T``), so swapping the inference method is a one-line change.
Draws of every method come back as ``[n, D]`` draw-major (:class:`SampleResult`, with the chain / member of
each row in ``.chain``). The book's named tasks and cached posterior runs live in
:mod:`wsbook.experiments.tasks`.
"""
from wsbook.bayes.laplace import LaplacePosterior, fit_laplace, ggn, jacobian
from wsbook.bayes.mcmc import DualAveraging, hmc, sghmc, sgld, step_schedule
from wsbook.bayes.metrics import (accuracy, agreement, bma, brier, ece, ess, gaussian_nll, nll, pointwise_nll,
                                  predictive_entropy, predictive_probs, rmse, split_rhat, total_variation)
from wsbook.bayes.model import GaussianPrior, LogPosterior, gaussian_kl, log_likelihood
from wsbook.bayes.samples import SampleResult
from wsbook.bayes.optim import MAPResult, deep_ensemble, fit_map, sgd_trajectory
from wsbook.bayes.vi import MeanFieldPosterior, fit_mean_field, fit_vi

__all__ = [
    "accuracy", "agreement", "bma", "brier", "ece", "ess", "gaussian_nll", "nll", "pointwise_nll",
    "predictive_entropy", "predictive_probs", "rmse",
    "split_rhat", "total_variation",
    "GaussianPrior", "LogPosterior", "log_likelihood",
    "MeanFieldPosterior", "fit_mean_field", "fit_vi", "gaussian_kl",
    "LaplacePosterior", "fit_laplace", "ggn", "jacobian",
    "DualAveraging", "SampleResult", "hmc", "sghmc", "sgld", "step_schedule",
    "MAPResult", "deep_ensemble", "fit_map", "sgd_trajectory",
]
