"""The definitions of the Monte Carlo bandpower products, as numpy functions on bandpower arrays.

The transfer function, the noise bias, the bandpower covariance with its Hartlap factor and the
debiased bandpowers of a data map are defined once, here, because two programs that may not import
each other compute them: the map-maker's tests and benchmarks (``mapmaker.model.bandpowers``
re-exports these functions) on batches of realisations, and the service's running aggregates
(``service.products.aggregates``) one realisation at a time. The import rules
(``tests/unit/test_architecture.py``) let both import ``campaignlib`` and neither import the other, so the
shared definition lives here. numpy only: no pspy, no healpy (the harmonic transforms that make
bandpowers out of maps stay in ``mapmaker``).

Shapes: bandpowers are ``[6, n_bins]`` K^2 (rows TT EE BB TE EB TB, :data:`schemas.result.SPECTRA`);
a stack of realisations ``[n_sims, 6, n_bins]``; the covariance is over the flattened ``[6 n_bins]``
(spectrum-major: index ``s * n_bins + b``).
"""

from __future__ import annotations

import math

import numpy as np


def mean_and_error(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over axis 0 and its Monte Carlo error ``std(ddof=1) / sqrt(n)`` (NaN for fewer than 2 samples)."""
    samples = np.asarray(samples, dtype=np.float64)
    n = samples.shape[0]
    mean = samples.mean(axis=0)
    if n < 2:
        return mean, np.full_like(mean, np.nan)
    return mean, samples.std(axis=0, ddof=1) / math.sqrt(n)


def transfer_ratio(mean_cb: np.ndarray, error_cb: np.ndarray, model_cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(F_b, sigma_F_b) = (mean / model, error / |model|)``; NaN where the model is 0 (EB, TB)."""
    model_cb = np.asarray(model_cb, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        transfer = np.where(model_cb != 0, np.asarray(mean_cb) / model_cb, np.nan)
        sigma = np.where(model_cb != 0, np.asarray(error_cb) / np.abs(model_cb), np.nan)
    return transfer, sigma


def transfer_function(signal_cb: np.ndarray, model_cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MASTER's transfer function per bandpower from signal-only realisations: ``(F_b, sigma_F_b)``.

    ``signal_cb [n_sims, 6, n_bins]`` decoupled bandpowers of the campaign's maps; ``model_cb
    [6, n_bins]`` the input sky through the bandpower windows with its beam
    (``mapmaker.model.bandpowers.model_bandpowers``): ``<C_b> = F_b B_b^2 C_b^in``, so
    ``F_b = mean / model`` and its Monte Carlo error ``std / sqrt(n_sims) / model``
    (``std`` with n - 1; NaN where the model is 0, e.g. EB and TB, or n_sims < 2).
    """
    mean, error = mean_and_error(signal_cb)
    return transfer_ratio(mean, error, model_cb)


# F_b is "poorly determined" where its Monte Carlo error exceeds this fraction of |F_b|.
POORLY_DETERMINED = 0.2


def transfer_unreliable(transfer: np.ndarray, sigma: np.ndarray, reliable_bins: np.ndarray) -> np.ndarray:
    """Bins of F_b not to be trusted, bool [..., n_bins] like ``transfer``: bins above 2 nside
    (``reliable_bins`` [n_bins] False, where HEALPix transforms are inaccurate), bins where F_b is undefined,
    and bins where it is poorly determined: its Monte Carlo error ``sigma`` exceeds :data:`POORLY_DETERMINED`
    times |F_b|. The last happen where the model through the beam is negligible against what the mask and
    the map-maker put into the bin (BB at low ell on a masked sky, where E leaks into B; a beam-suppressed
    tail). A NaN ``sigma`` (fewer than 2 realisations) judges nothing."""
    transfer = np.asarray(transfer, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        poorly = np.isfinite(sigma) & (sigma > POORLY_DETERMINED * np.abs(transfer))
    return ~np.asarray(reliable_bins, dtype=bool) | ~np.isfinite(transfer) | poorly


def noise_bias(noise_cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The noise bias per bandpower from noise-only realisations ``[n_sims, 6, n_bins]``: ``(N_b, sigma_N_b)`` K^2."""
    return mean_and_error(noise_cb)


def hartlap_factor(n: int, p: int) -> float:
    """``(n - p - 2) / (n - 1)`` (Hartlap et al. 2007): multiplies the inverse of a sample covariance of ``p``
    quantities from ``n`` realisations to make it unbiased; NaN when ``n <= p + 2`` (no usable inverse)."""
    return (n - p - 2) / (n - 1) if n > p + 2 else math.nan


def bandpower_covariance(samples: np.ndarray) -> tuple[np.ndarray, int, float]:
    """Sample covariance of bandpowers ``samples [n_sims, ...]`` flattened to ``[n_sims, p]``: ``(cov [p, p], n, hartlap)``.

    ``hartlap`` (:func:`hartlap_factor`) multiplies ``inv(cov)``; slice the spectra and bins wanted
    before calling: p counts every bandpower given.
    """
    samples = np.asarray(samples, dtype=np.float64)
    n = samples.shape[0]
    flat = samples.reshape(n, -1)
    p = flat.shape[1]
    if n < 2:
        raise ValueError(f"{n} realisation(s): a covariance needs at least 2")
    covariance = np.cov(flat, rowvar=False, ddof=1).reshape(p, p)
    return covariance, n, hartlap_factor(n, p)


def moments_add(count: int, mean: np.ndarray, comoment: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Add one sample ``value [p]`` to the running ``mean [p]`` and co-moment ``comoment [p, p]`` of ``count``
    samples (Welford's update, which stays accurate where the scatter is small against the mean).

    ``comoment`` is ``sum_i (x_i - mean)(x_i - mean)^T``; :func:`covariance_from_moments` turns it into
    the sample covariance, equal to :func:`bandpower_covariance` on the same samples.
    """
    value = np.asarray(value, dtype=np.float64).reshape(-1)
    delta = value - mean
    mean = mean + delta / (count + 1)
    comoment = comoment + np.outer(delta, value - mean)
    return mean, comoment


def moments_merge(
    count_a: np.ndarray, mean_a: np.ndarray, m2_a: np.ndarray, count_b: np.ndarray, mean_b: np.ndarray, m2_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge two sets of running moments element-wise (Chan, Golub and LeVeque's pairwise update).

    ``count_* [n]`` int64 samples per element (0 allowed), ``mean_*`` and ``m2_*`` ``[k, n]`` (or ``[n]``):
    the mean and the sum of squared deviations of each element over its samples (:func:`moments_add`'s
    ``comoment`` diagonal, Welford's M2). With ``n = nA + nB`` and ``delta = meanB - meanA``::

        mean = meanA + delta nB / n,    M2 = M2A + M2B + delta^2 nA nB / n

    which is what adding B's samples one by one would give, to round-off. Elements where both counts
    are 0 return mean 0 and M2 0. Returns ``(count, mean, m2)``.
    """
    count_a = np.asarray(count_a, dtype=np.int64)
    count_b = np.asarray(count_b, dtype=np.int64)
    count = count_a + count_b
    safe = np.where(count > 0, count, 1).astype(np.float64)
    delta = np.asarray(mean_b, dtype=np.float64) - np.asarray(mean_a, dtype=np.float64)
    mean = mean_a + delta * (count_b / safe)
    m2 = m2_a + m2_b + delta * delta * (count_a.astype(np.float64) * count_b / safe)
    return count, mean, m2


def covariance_from_moments(count: int, comoment: np.ndarray) -> tuple[np.ndarray, int, float]:
    """``(cov [p, p], n, hartlap)`` from a running co-moment of ``count`` samples (ddof 1), as :func:`bandpower_covariance`."""
    if count < 2:
        raise ValueError(f"{count} realisation(s): a covariance needs at least 2")
    covariance = np.asarray(comoment, dtype=np.float64) / (count - 1)
    covariance = 0.5 * (covariance + covariance.T)  # the update's rounding is not exactly symmetric
    return covariance, count, hartlap_factor(count, covariance.shape[0])


def debiased_bandpowers(
    data_cb: np.ndarray,
    *,
    noise_bias_cb: np.ndarray,
    transfer_b: np.ndarray,
    covariance: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Unbiased bandpowers of a data map: ``((C_b - N_b) / F_b, sigma_b)``, all ``[6, n_bins]`` K^2.

    ``data_cb`` the data map's decoupled bandpowers, ``noise_bias_cb`` and ``transfer_b`` from the
    campaigns. The result estimates the sky's bandpowers with the beam (MASTER's ``B_b^2 C_b``).
    ``sigma_b = sqrt(diag covariance) / |F_b|`` with ``covariance [6 n_bins, 6 n_bins]`` of
    signal+noise realisations (:func:`bandpower_covariance`); None without it. The Monte Carlo
    errors of N_b and F_b are not included.
    """
    data_cb = np.asarray(data_cb, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        cb = (data_cb - np.asarray(noise_bias_cb)) / np.asarray(transfer_b)
        if covariance is None:
            return cb, None
        variance = np.diag(np.asarray(covariance, dtype=np.float64)).reshape(data_cb.shape)
        return cb, np.sqrt(variance) / np.abs(transfer_b)


# --------------------------------------------------------------------------- E/B transfer matrix

MATRIX_SPECTRA = ("EE", "EB", "BB")  # the order of the transfer matrix's rows (out) and columns (in)
MATRIX_ROWS = (1, 4, 2)  # their rows in a [6, n_bins] bandpower array (TT EE BB TE EB TB)


class TransferMatrix:
    """The pipeline's E/B transfer matrix per bin, from a pure-E and a pure-B signal-only campaign.

    ``matrix [n_bins, 3, 3]``: ``<C_b^X> = sum_Y T_b[X, Y] m_b^Y`` with X (out) and Y (in) in
    :data:`MATRIX_SPECTRA` = (EE, EB, BB) and ``m_b^Y`` the input model bandpowers (the input C_l with
    its beam through the bandpower windows, ``mapmaker.model.bandpowers.model_bandpowers``). Column EE is
    the pure-E campaign's mean (EE, EB, BB) over its model EE, column BB the pure-B campaign's over its
    model BB; T_b[BB, EE] is the E -> B leakage that pure-B MASTER leaves (pixelisation, a cut sky) and a
    per-bin F_b would fold into a multiplicative factor.

    The EB column is the identity, assumed, not measured: neither campaign has an EB input (a sky of E
    modes only, or of B modes only, has no E-B correlation), and the model's EB is 0 (parity). So the
    correction removes the EE and BB leakage from a data EB, but does not undo any suppression or mixing
    of a real EB signal; its ``error`` is 0.

    ``error [n_bins, 3, 3]`` the Monte Carlo error of each element; ``column_covariance [n_bins, 3, 3, 3]``
    (bin, input column, out, out) the covariance of each column's elements (one campaign's correlated
    means), which :func:`matrix_debiased_bandpowers` propagates. Elements of a bin whose input model is
    not positive are NaN.
    """

    def __init__(self, matrix: np.ndarray, column_covariance: np.ndarray, n_e: int, n_b: int) -> None:
        self.matrix = np.asarray(matrix, dtype=np.float64)
        self.column_covariance = np.asarray(column_covariance, dtype=np.float64)
        self.n_e = n_e
        self.n_b = n_b

    @property
    def n_bins(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def error(self) -> np.ndarray:
        """``[n_bins, 3, 3]``: sqrt of each column's variances (0 in the assumed EB column; NaN below 2 realisations)."""
        variances = np.diagonal(self.column_covariance, axis1=2, axis2=3)  # [n_bins, in, out]
        return np.sqrt(np.maximum(np.swapaxes(variances, 1, 2), 0.0))

    def inverse(self) -> np.ndarray:
        """``[n_bins, 3, 3]`` per-bin inverse (NaN for a bin with a NaN or singular matrix)."""
        inverse = np.full_like(self.matrix, np.nan)
        for b, block in enumerate(self.matrix):
            if np.all(np.isfinite(block)) and abs(np.linalg.det(block)) > 0:
                inverse[b] = np.linalg.inv(block)
        return inverse


def _column(
    mean_cb: np.ndarray, covariance: np.ndarray | None, n: int, model_cb: np.ndarray, model_row: int
) -> tuple[np.ndarray, np.ndarray]:
    """One measured column [n_bins, 3] and its covariance [n_bins, 3, 3] (see :func:`transfer_matrix`)."""
    mean_cb = np.asarray(mean_cb, dtype=np.float64)
    n_bins = mean_cb.shape[1]
    model = np.asarray(model_cb, dtype=np.float64)[model_row]
    scale = np.where(model > 0, 1.0 / np.where(model > 0, model, 1.0), np.nan)  # [n_bins]
    column = mean_cb[list(MATRIX_ROWS)].T * scale[:, None]
    column_covariance = np.full((n_bins, 3, 3), np.nan)
    if covariance is not None and n >= 2:
        covariance = np.asarray(covariance, dtype=np.float64)
        for b in range(n_bins):
            index = [row * n_bins + b for row in MATRIX_ROWS]
            column_covariance[b] = covariance[np.ix_(index, index)] / n * scale[b] ** 2
    return column, column_covariance


def transfer_matrix(
    *,
    e_mean: np.ndarray,
    e_covariance: np.ndarray | None,
    e_n: int,
    e_model: np.ndarray,
    b_mean: np.ndarray,
    b_covariance: np.ndarray | None,
    b_n: int,
    b_model: np.ndarray,
) -> TransferMatrix:
    """The :class:`TransferMatrix` of a pure-E and a pure-B campaign's aggregates.

    Per campaign: ``mean [6, n_bins]`` K^2 the mean decoupled bandpowers of its ``n`` realisations,
    ``covariance [6 n_bins, 6 n_bins]`` one realisation's (None below 2: NaN errors), ``model [6, n_bins]``
    its input through the windows. Column EE = ``e_mean[(EE, EB, BB)] / e_model[EE]``, column BB =
    ``b_mean[(EE, EB, BB)] / b_model[BB]``; their covariances ``cov / n / model^2``; column EB = (0, 1, 0).
    """
    e_column, e_cov = _column(e_mean, e_covariance, e_n, e_model, MATRIX_ROWS[0])
    b_column, b_cov = _column(b_mean, b_covariance, b_n, b_model, MATRIX_ROWS[2])
    n_bins = e_column.shape[0]
    if b_column.shape[0] != n_bins:
        raise ValueError(f"the pure-E campaign has {n_bins} bins, the pure-B one {b_column.shape[0]}")
    matrix = np.zeros((n_bins, 3, 3))
    matrix[:, :, 0] = e_column
    matrix[:, 1, 1] = 1.0
    matrix[:, :, 2] = b_column
    column_covariance = np.zeros((n_bins, 3, 3, 3))
    column_covariance[:, 0] = e_cov
    column_covariance[:, 2] = b_cov
    return TransferMatrix(matrix, column_covariance, e_n, b_n)


def transfer_matrix_from_samples(
    e_samples: np.ndarray, e_model: np.ndarray, b_samples: np.ndarray, b_model: np.ndarray
) -> TransferMatrix:
    """:func:`transfer_matrix` of stacks of realisations ``[n, 6, n_bins]`` of a pure-E and a pure-B campaign."""
    def moments(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, int]:
        samples = np.asarray(samples, dtype=np.float64)
        n = samples.shape[0]
        covariance = bandpower_covariance(samples)[0] if n >= 2 else None
        return samples.mean(axis=0), covariance, n

    e_mean, e_cov, e_n = moments(e_samples)
    b_mean, b_cov, b_n = moments(b_samples)
    return transfer_matrix(
        e_mean=e_mean, e_covariance=e_cov, e_n=e_n, e_model=e_model,
        b_mean=b_mean, b_covariance=b_cov, b_n=b_n, b_model=b_model,
    )


class MatrixDebiased:
    """Bandpowers ``cb [6, n_bins]`` K^2 corrected by the inverse transfer matrix, with two error parts.

    ``sigma_data [6, n_bins]`` from the data's Monte Carlo covariance (None without one);
    ``sigma_matrix [6, n_bins]`` from the transfer matrix's own Monte Carlo error (EE EB BB rows; NaN
    where it is unknown, 0 for rows corrected by F_b, whose error is stated with F_b). The two are
    independent: the total is their quadrature sum (:attr:`sigma`).
    """

    def __init__(self, cb: np.ndarray, sigma_data: np.ndarray | None, sigma_matrix: np.ndarray) -> None:
        self.cb = cb
        self.sigma_data = sigma_data
        self.sigma_matrix = sigma_matrix

    @property
    def sigma(self) -> np.ndarray | None:
        if self.sigma_data is None:
            return None
        return np.sqrt(self.sigma_data**2 + self.sigma_matrix**2)


def matrix_debiased_bandpowers(
    data_cb: np.ndarray,
    *,
    noise_bias_cb: np.ndarray,
    matrix: TransferMatrix,
    transfer_b: np.ndarray | None = None,
    covariance: np.ndarray | None = None,
) -> MatrixDebiased:
    """Unbiased bandpowers of a data map with the E/B transfer matrix: ``T_b^-1 (C_b - N_b)`` for (EE, EB, BB).

    ``data_cb``, ``noise_bias_cb`` ``[6, n_bins]`` K^2. The rows TT, TE, TB are ``(C_b - N_b) / F_b``
    with ``transfer_b [6, n_bins]`` (:func:`transfer_function` of the pure-E campaign, which keeps T and
    TE), NaN without it. ``covariance [6 n_bins, 6 n_bins]`` of the data's bandpowers (signal+noise
    realisations) gives ``sigma_data``: per bin ``diag(T^-1 S_b T^-T)`` with S_b its (EE, EB, BB) block.
    The matrix's error: ``c = T^-1 d`` moves by ``-T^-1 dT c``; the columns come from independent
    campaigns, so ``var = diag(T^-1 (sum_Y c_Y^2 cov(T[:, Y])) T^-T)`` (first order in dT).
    The result estimates the sky's bandpowers with the beam, as :func:`debiased_bandpowers`.
    """
    data_cb = np.asarray(data_cb, dtype=np.float64)
    n_bins = data_cb.shape[1]
    if matrix.n_bins != n_bins:
        raise ValueError(f"the data have {n_bins} bins, the transfer matrix {matrix.n_bins}")
    signal = data_cb - np.asarray(noise_bias_cb, dtype=np.float64)
    rows = list(MATRIX_ROWS)
    inverse = matrix.inverse()  # [n_bins, 3, 3]
    cb = np.full_like(signal, np.nan)
    corrected = np.einsum("bij,jb->ib", inverse, signal[rows])  # [3, n_bins]
    cb[rows] = corrected
    other = [row for row in range(signal.shape[0]) if row not in rows]
    sigma_matrix = np.zeros_like(signal)
    with np.errstate(divide="ignore", invalid="ignore"):
        if transfer_b is not None:
            cb[other] = signal[other] / np.asarray(transfer_b)[other]
        weighted = np.einsum("yb,byij->bij", corrected**2, matrix.column_covariance)  # sum_Y c_Y^2 cov(T[:, Y])
        matrix_variance = np.einsum("bij,bjk,blk->bil", inverse, weighted, inverse)
        sigma_matrix[rows] = np.sqrt(np.maximum(np.diagonal(matrix_variance, axis1=1, axis2=2), 0.0)).T
        sigma_data = None
        if covariance is not None:
            covariance = np.asarray(covariance, dtype=np.float64)
            sigma_data = np.full_like(signal, np.nan)
            blocks = np.empty((n_bins, 3, 3))
            for b in range(n_bins):
                index = [row * n_bins + b for row in rows]
                blocks[b] = covariance[np.ix_(index, index)]
            data_variance = np.einsum("bij,bjk,blk->bil", inverse, blocks, inverse)
            sigma_data[rows] = np.sqrt(np.maximum(np.diagonal(data_variance, axis1=1, axis2=2), 0.0)).T
            if transfer_b is not None:
                diagonal = np.diag(covariance).reshape(signal.shape)
                sigma_data[other] = np.sqrt(diagonal[other]) / np.abs(np.asarray(transfer_b)[other])
    return MatrixDebiased(cb, sigma_data, sigma_matrix)
