"""``python -m service.cli``: the ``mapcampaign`` command without its console script (``up`` starts its parts so)."""

from service.cli import main

main()
