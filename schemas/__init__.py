"""Pydantic models every part of MapCampaign speaks: campaign specs, results, API messages."""
from schemas.io import SpecError, load_spec
from schemas.result import RealizationResult
from schemas.spec import CampaignSpec, scan_key, spec_hash

__all__ = ["CampaignSpec", "RealizationResult", "SpecError", "load_spec", "scan_key", "spec_hash"]
