"""``python -m mapcampaign.cli``: the ``mapcampaign`` command without its console script (``up`` starts its parts so)."""

from mapcampaign.cli import main

main()
