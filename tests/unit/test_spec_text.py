"""Names and paths refuse the characters that make text read differently from what it is (issue 10)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.spec import CampaignSpec
from tests.support.service_helpers import spec_data


@pytest.mark.parametrize("hidden", ["\u202e", "\u202a", "\u202d", "\u2066", "\u2069", "\x00", "\u2028"])
def test_names_refuse_control_and_bidi_override_characters(hidden):
    with pytest.raises(ValidationError, match="control characters"):
        CampaignSpec.model_validate(spec_data(name=f"invoice{hidden}gnp.exe"))


def test_names_keep_ordinary_right_to_left_text():
    assert CampaignSpec.model_validate(spec_data(name="שלום مرحبا")).name == "שלום مرحبا"
