"""PCG against a direct solve."""
import numpy as np

from mapmaker.solve.solver import pcg


def _diagonally_dominant_system(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random symmetric positive definite matrix [n, n], a right-hand side [n] and the matrix's diagonal [n]."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n))
    matrix = a @ a.T + n * np.eye(n)
    return matrix, rng.standard_normal(n), np.diag(matrix)


def test_pcg_solves_a_symmetric_positive_definite_system():
    matrix, b, diagonal = _diagonally_dominant_system(7, 40)
    history = []
    result = pcg(lambda p: matrix @ p, lambda r: r / diagonal, np.dot, b, tol=1e-12, max_iter=100,
                 on_iteration=lambda k, res: history.append((k, res)))
    assert result.converged
    np.testing.assert_allclose(result.solution, np.linalg.solve(matrix, b), rtol=1e-10)
    assert result.residual_history[0] == 1.0 and result.residual_history[-1] < 1e-12
    assert len(result.residual_history) == result.iterations + 1 == len(history) + 1
    restarted = pcg(lambda p: matrix @ p, lambda r: r / diagonal, np.dot, b, tol=1e-12, max_iter=100, x0=result.solution)
    assert restarted.iterations <= 1


def test_exact_preconditioner_converges_in_one_iteration():
    matrix = np.diag([1.0, 5.0, 100.0])
    b = np.array([1.0, 2.0, 3.0])
    result = pcg(lambda p: matrix @ p, lambda r: np.linalg.solve(matrix, r), np.dot, b, tol=1e-14, max_iter=10)
    assert result.iterations == 1
    np.testing.assert_allclose(result.solution, [1.0, 0.4, 0.03])


def test_max_iter_stops_without_convergence_and_zero_rhs():
    matrix = np.diag(np.arange(1.0, 51.0))
    result = pcg(lambda p: matrix @ p, lambda r: r, np.dot, np.ones(50), tol=1e-14, max_iter=3)
    assert result.iterations == 3 and not result.converged
    zero = pcg(lambda p: matrix @ p, lambda r: r, np.dot, np.zeros(50), tol=1e-6, max_iter=3)
    assert zero.converged and zero.iterations == 0 and np.all(zero.solution == 0)


def test_operators_may_return_one_buffer_every_call():
    """realize hands the solver the same output array on every call; the iterates must not change by a bit."""
    matrix, b, diagonal = _diagonally_dominant_system(11, 30)
    fresh = pcg(lambda p: matrix @ p, lambda r: r / diagonal, np.dot, b, tol=1e-13, max_iter=100)
    product, preconditioned = np.empty(30), np.empty(30)
    buffered = pcg(lambda p: np.matmul(matrix, p, out=product), lambda r: np.divide(r, diagonal, out=preconditioned),
                   np.dot, b, tol=1e-13, max_iter=100)
    assert buffered.iterations == fresh.iterations and fresh.converged
    np.testing.assert_array_equal(buffered.solution, fresh.solution)
    assert buffered.residual_history == fresh.residual_history


def test_ritz_values_of_a_converged_solve_bracket_the_preconditioned_spectrum():
    """PCG's own coefficients give the extreme eigenvalues of M^-1 A: here D^-1 A with D = diag(A)."""
    matrix, b, diagonal = _diagonally_dominant_system(5, 60)
    scaled = matrix / np.sqrt(np.outer(diagonal, diagonal))  # D^-1/2 A D^-1/2: the spectrum of D^-1 A
    exact = np.linalg.eigvalsh(scaled)
    result = pcg(lambda p: matrix @ p, lambda r: r / diagonal, np.dot, b, tol=1e-13, max_iter=200)
    ritz = result.ritz_values()
    assert len(ritz) == result.iterations == len(result.step_lengths) == len(result.conjugations)
    assert np.all(np.diff(ritz) >= 0)
    # Ritz values lie inside the spectrum. The largest eigenvalue stands apart and has converged; the smallest
    # sit in a cluster (this matrix's lower edge) that the Ritz value resolves to 1%.
    assert exact[0] * (1 - 1e-9) <= ritz[0] and ritz[-1] <= exact[-1] * (1 + 1e-9)
    np.testing.assert_allclose(ritz[-1], exact[-1], rtol=1e-9)
    np.testing.assert_allclose(ritz[0], exact[0], rtol=1e-2)


def test_ritz_values_after_as_many_iterations_as_eigenvalues_are_the_eigenvalues():
    eigenvalues = np.array([0.5, 1.0, 2.0, 3.0, 7.0])
    matrix = np.diag(eigenvalues)
    result = pcg(lambda p: matrix @ p, lambda r: r, np.dot, np.ones(5), tol=1e-15, max_iter=5)
    np.testing.assert_allclose(result.ritz_values(), eigenvalues, rtol=1e-10)
    spectrum = result.spectrum()
    assert spectrum is not None and set(spectrum) == {"smallest", "largest", "condition"}
    np.testing.assert_allclose([spectrum["smallest"], spectrum["largest"], spectrum["condition"]], [0.5, 7.0, 14.0],
                               rtol=1e-10)
    zero = pcg(lambda p: p, lambda r: r, np.dot, np.zeros(3), tol=1e-6, max_iter=3)
    assert len(zero.ritz_values()) == 0 and zero.spectrum() is None
