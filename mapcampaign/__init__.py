"""MapCampaign's Python client: submit Monte Carlo map-making campaigns, follow them, read their maps and products.

::

    import mapcampaign

    with mapcampaign.Client() as client:   # server and token as for the `mapcampaign` CLI
        campaign = client.submit("campaign.toml")
        client.wait(campaign.id, timeout=3600)
        iqu = client.realization_map(campaign.id, 0)

Errors are :mod:`mapcampaign.errors` (``ApiError`` with ``status``, ``code`` and ``detail``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mapcampaign import errors

if TYPE_CHECKING:
    from mapcampaign.client import Client
    from mapcampaign.products import Products

__all__ = ["Client", "Products", "errors"]


def __getattr__(name: str) -> Any:
    # Deferred: the client brings httpx and pydantic, and the CLI imports this package (its connection
    # defaults) on every start, `--help` included; the classes load when first named.
    if name == "Client":
        from mapcampaign.client import Client

        return Client
    if name == "Products":
        from mapcampaign.products import Products

        return Products
    raise AttributeError(f"module 'mapcampaign' has no attribute {name!r}")
