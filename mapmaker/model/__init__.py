"""The numerical model of a campaign's products: pure functions on arrays, no MPI and no I/O of their own."""
