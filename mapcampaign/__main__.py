"""``python -m mapcampaign``: the ``mapcampaign`` command without its console script."""

from mapcampaign.cli import main

main()
