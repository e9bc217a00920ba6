"""The campaign service: the FastAPI app (``service.app``), its database, and its rooms (campaigns, queue,
workers, events, instruments, products, dashboard, auth).

The ``mapcampaign`` command that starts it and keeps its database and tokens (``serve``, ``up``, ``db``,
``token``) lives in ``mapcampaign.cli``.
"""
