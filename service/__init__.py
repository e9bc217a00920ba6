"""The campaign service: FastAPI app, database, queue, auth and the ``mapcampaign`` CLI."""
