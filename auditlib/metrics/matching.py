"""Pairing reconstructions with originals: the order of a batch is not identifiable from
its averaged update, so each original is matched to one reconstruction by the Hungarian
algorithm on per-pair MSE (the assignment with the lowest total error), after keeping
every reconstruction that is unmistakably one original (``SURE_MSE``) with it: on the total
error alone, an exact copy can be paired with the wrong original to spare a poor pair a
large error (a grey filler beside a dark original), and the images recovered undercount."""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment


def pairwise_mse(reconstructions: np.ndarray, originals: np.ndarray) -> np.ndarray:
    """cost[i, j] = MSE(original i, reconstruction j); arrays are N x H x W x C in [0, 1].

    Through |o|^2 + |r|^2 - 2 o.r, a matrix product: the difference of every pair would be a
    B x B x D array (4.9 GB at B = 64 and 224 x 224 colour); this needs the two B x D arrays.
    """
    o = originals.reshape(len(originals), -1).astype(np.float64)
    r = reconstructions.reshape(len(reconstructions), -1).astype(np.float64)
    o_norms, r_norms = np.einsum("ij,ij->i", o, o), np.einsum("ij,ij->i", r, r)  # no B x D temp
    squared = o_norms[:, None] + r_norms[None, :] - 2.0 * (o @ r.T)
    return np.maximum(squared, 0.0) / o.shape[1]  # rounding can dip a zero distance below 0


# A pair this close (PSNR >= 40 dB) is that original: two different images are rarely within
# it of one reconstruction, and where they are (near duplicates) either pairing scores alike.
SURE_MSE = 1e-4


def match(reconstructions: np.ndarray, originals: np.ndarray) -> np.ndarray:
    """order[i] = index of the reconstruction assigned to original i: the most pairs within
    ``SURE_MSE``, then the lowest total MSE (each sure pair weighs more than any total)."""
    cost = pairwise_mse(reconstructions, originals)
    cost = cost - (cost <= SURE_MSE) * (len(originals) + 1.0)
    rows, cols = linear_sum_assignment(cost)
    order = np.empty(len(originals), dtype=np.int64)
    order[rows] = cols
    return order


def label_accuracy(predicted: list[int] | np.ndarray, true: list[int] | np.ndarray) -> float:
    """Fraction of true labels recovered, order-free: |multiset(pred) ∩ multiset(true)| / B."""
    if len(true) == 0:
        raise ValueError("label accuracy of an empty batch is undefined")
    pred_counts = np.bincount(np.asarray(predicted, dtype=np.int64), minlength=1)
    true_counts = np.bincount(np.asarray(true, dtype=np.int64), minlength=1)
    size = max(len(pred_counts), len(true_counts))
    pred_counts = np.pad(pred_counts, (0, size - len(pred_counts)))
    true_counts = np.pad(true_counts, (0, size - len(true_counts)))
    return float(np.minimum(pred_counts, true_counts).sum() / len(true))
