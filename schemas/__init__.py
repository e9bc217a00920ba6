"""Pydantic models and contracts every part of MapCampaign speaks.

Contracts only: the code that reads instrument files, the Monte Carlo maths and the HTTP transport live
beside this package, in ``campaignlib``.

======================  ==========================================================
module                  what it holds
======================  ==========================================================
``spec``                the campaign spec (:class:`~schemas.spec.CampaignSpec`), its scan key
``io``                  spec files (TOML, YAML, JSON) read and checked
``api``                 REST messages between the service, its users and its workers
``result``              ``result.json``: what one realisation reports
``products``            Monte Carlo products (aggregates) as the API returns them
``plan``                overlap-plan records
``calibration``         measured network figures of a site
``programs``            the worker <-> runner <-> map-maker contract: command line, exit codes, file names
``states``              campaign, realisation, attempt and plan states and their allowed transitions
``files``               checksums and atomic, durable writes (standard library only)
======================  ==========================================================

Nothing is imported here: ``import schemas.programs`` (the task runner, on compute nodes) must not pay for
the spec models it does not use.
"""
