"""The ground floor beside ``schemas``: code every program shares that is not a contract.

``schemas`` says what the programs exchange; ``campaignlib`` holds what they all need to do with it, and
is imported by the service, the worker, the map-maker and the client alike. It imports ``schemas`` and
nothing else of the project, and ``schemas`` imports nothing of it (tests/unit/test_architecture.py).

======================  ==========================================================
module                  what it holds
======================  ==========================================================
``instrument``          TOAST focal-plane (HDF5) and schedule (ECSV) files, read with bounds checked
                        first; a spec's files resolved into its detectors and scans; the dashboard's
                        instrument summary
``ephemeris``           the anti-Sun direction a satellite's spin axis follows
``montecarlo``          the Monte Carlo estimators (numpy): means, covariances, transfer functions
                        and matrices, debiased band powers
``transport``           the HTTP transport (httpx) the worker and the user's client share: retries,
                        timeouts, error bodies
======================  ==========================================================

Nothing is imported here: a program pays only for the module it uses.
"""
