"""Preconditioned conjugate gradients, written as in the textbook.

Y. Saad, *Iterative Methods for Sparse Linear Systems*, 2nd ed. (SIAM 2003),
Algorithm 9.1 "Preconditioned Conjugate Gradient", solving ``A x = b`` with
preconditioner ``M``. Here ``A = P^T N^-1 P``, ``b = P^T N^-1 d`` and ``M^-1``
is the block-diagonal white-noise approximation of ``A`` (paper section 3.1).

The solver knows nothing of MPI: the caller passes the matrix, the
preconditioner and a dot product that already sum over ranks, and may pass
the kernels of its map-sized vector updates (:mod:`mapmaker.kernels.vectors`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import scipy.linalg

from mapmaker.kernels import vectors as numpy_vectors

Operator = Callable[[np.ndarray], np.ndarray]


@dataclass
class PCGResult:
    solution: np.ndarray
    iterations: int
    converged: bool
    residual_history: list[float] = field(default_factory=list)  # ||r_k|| / ||b||, k = 0 .. iterations
    step_lengths: list[float] = field(default_factory=list)  # alpha_j, j = 0 .. iterations - 1
    conjugations: list[float] = field(default_factory=list)  # beta_j, j = 0 .. iterations - 1

    def ritz_values(self) -> np.ndarray:
        """The Ritz values [iterations] (ascending) of the preconditioned operator ``M^-1 A``: see :func:`ritz_values`."""
        return ritz_values(self.step_lengths, self.conjugations)

    def spectrum(self) -> dict[str, float] | None:
        """``result.json``'s ``spectrum``: the extreme Ritz values of ``M^-1 A`` and their ratio, the condition
        estimate; None when no iteration ran or round-off left a Ritz value that is not positive."""
        ritz = self.ritz_values()
        if len(ritz) == 0 or ritz[0] <= 0.0:
            return None
        return {"smallest": float(ritz[0]), "largest": float(ritz[-1]), "condition": float(ritz[-1] / ritz[0])}


def ritz_values(step_lengths: list[float], conjugations: list[float]) -> np.ndarray:
    """Eigenvalues [k] (ascending) of the Lanczos tridiagonal that k PCG iterations build, from their coefficients.

    PCG on ``A x = b`` with preconditioner ``M^-1`` is Lanczos on ``M^-1 A`` (Saad 2003, section 6.7.3):
    the tridiagonal ``T_k`` has diagonal ``1/alpha_j + beta_{j-1}/alpha_{j-1}`` and off-diagonal
    ``-sqrt(beta_j)/alpha_j``. Its eigenvalues, the Ritz values, lie inside the spectrum of ``M^-1 A``;
    the extreme ones converge first, so ``largest / smallest`` is a lower estimate of the condition number
    that sets PCG's rate, ``2 ((sqrt(kappa) - 1) / (sqrt(kappa) + 1))^k``. Free: no operator is applied.
    ``step_lengths`` alpha_j and ``conjugations`` beta_j as :func:`pcg` records them (only the first
    ``len(step_lengths) - 1`` conjugations are used).
    """
    alpha = np.asarray(step_lengths, dtype=float)
    if len(alpha) == 0:
        return np.zeros(0)
    beta = np.asarray(conjugations, dtype=float)[: len(alpha) - 1]
    diagonal = 1.0 / alpha
    diagonal[1:] += beta / alpha[:-1]
    return scipy.linalg.eigh_tridiagonal(diagonal, -np.sqrt(beta) / alpha[:-1], eigvals_only=True)


def pcg(
    apply_matrix: Operator,
    apply_preconditioner: Operator,
    dot: Callable[[np.ndarray, np.ndarray], float],
    b: np.ndarray,
    *,
    tol: float,
    max_iter: int,
    x0: np.ndarray | None = None,
    initial_residual: np.ndarray | None = None,
    on_iteration: Callable[[int, float], None] | None = None,
    on_estimate: Callable[[int, np.ndarray], None] | None = None,
    dot_and_norm: Callable[[np.ndarray, np.ndarray], tuple[float, float]] | None = None,
    vectors: ModuleType | None = None,
) -> PCGResult:
    """Solve ``A x = b`` until ``||r|| / ||b|| < tol`` or ``max_iter`` iterations.

    apply_matrix(p) -> A p and apply_preconditioner(r) -> M^-1 r return
    arrays shaped like b; each may return the same array on every call (a
    buffer of the caller's): the solver is done with one result before it
    asks for the next, and never writes into it. dot(u, v) is the global
    inner product. The vector updates reuse one scratch vector, so an
    iteration allocates nothing (a fresh map-sized array costs its page
    faults: ~3 ms at 550,000 pixels x 3, as much as the update itself).
    ``on_iteration(k, ||r_k|| / ||b||)`` is called after every iteration,
    ``on_estimate(k, x_k)`` with the map estimate itself (not to be kept:
    the solver updates it in place). ``initial_residual``, with ``x0``, is
    ``b - A x0`` when the caller has it already (a two-level
    preconditioner's start, whose ``A x0`` it holds), saving one operator.
    ``dot_and_norm(r, z)`` -> ``(dot(r, z), dot(r, r))``, when given, makes
    the two inner products of each iteration's residual one call (one pass
    and one global sum for a distributed caller). ``vectors``: the kernels of
    the step and the new direction (default the numpy reference,
    :mod:`mapmaker.kernels.vectors`; its compiled twin gives the same bits).
    The result keeps every iteration's alpha_j and beta_j: :meth:`PCGResult.ritz_values`.
    """
    # Saad's names: x = map, r = residual (b - A x), z = preconditioned residual (M^-1 r),
    # p = search direction, alpha = step length, beta = conjugation coefficient.
    vectors = vectors or numpy_vectors
    if dot_and_norm is None:
        def dot_and_norm(r: np.ndarray, z: np.ndarray) -> tuple[float, float]:
            return dot(r, z), dot(r, r)

    norm_b = math.sqrt(dot(b, b))
    map_estimate = np.zeros_like(b) if x0 is None else x0.copy()
    if norm_b == 0.0:
        return PCGResult(map_estimate, 0, True, [0.0])
    if initial_residual is not None:
        residual = initial_residual.copy()
    else:
        residual = b - apply_matrix(map_estimate) if x0 is not None else b.copy()
    preconditioned_residual = apply_preconditioner(residual)
    search_direction = preconditioned_residual.copy()
    residual_dot_z, residual_norm_squared = dot_and_norm(residual, preconditioned_residual)
    history = [math.sqrt(residual_norm_squared) / norm_b]
    step_lengths: list[float] = []
    conjugations: list[float] = []
    scratch = np.empty_like(b)
    iterations = 0
    while history[-1] >= tol and iterations < max_iter:
        matrix_times_direction = apply_matrix(search_direction)
        step_length = residual_dot_z / dot(matrix_times_direction, search_direction)  # alpha_j
        # x_{j+1} = x_j + alpha_j p_j, r_{j+1} = r_j - alpha_j A p_j
        vectors.step(map_estimate, residual, search_direction, matrix_times_direction, step_length, scratch)
        preconditioned_residual = apply_preconditioner(residual)  # z_{j+1} = M^-1 r_{j+1}
        next_residual_dot_z, residual_norm_squared = dot_and_norm(residual, preconditioned_residual)
        conjugation = next_residual_dot_z / residual_dot_z  # beta_j = (r_{j+1}, z_{j+1}) / (r_j, z_j)
        vectors.conjugate(search_direction, preconditioned_residual, conjugation)  # p_{j+1} = z_{j+1} + beta_j p_j
        residual_dot_z = next_residual_dot_z
        step_lengths.append(step_length)
        conjugations.append(conjugation)
        iterations += 1
        history.append(math.sqrt(residual_norm_squared) / norm_b)
        if on_iteration is not None:
            on_iteration(iterations, history[-1])
        if on_estimate is not None:
            on_estimate(iterations, map_estimate)
    return PCGResult(map_estimate, iterations, history[-1] < tol, history, step_lengths, conjugations)
