"""Counter-based random streams: every stream's Philox key derives from what it is.

A stream is named by a tuple of integers and a stream name; its 128-bit
Philox key is the first 16 bytes of the SHA-256 of the canonical JSON of
``[RNG_SCHEME_VERSION, stream, *fields]``, read as two little-endian uint64
words. The counter starts at 0. No state is carried from one stream to the
next, so a stream gives the same numbers whichever rank draws it, in any
order: the TOD of a realisation does not depend on the rank count.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

RNG_SCHEME_VERSION = "mapcampaign-rng-v1"

RNG_SCHEME = (
    "numpy Philox4x64-10, counter from 0; key = first 16 bytes of sha256(canonical JSON of "
    f'["{RNG_SCHEME_VERSION}", stream, ...fields]) as two little-endian uint64. '
    'noise: ["noise", campaign_seed, realization, detector_index, interval_index], '
    "interval_index = chunk * intervals_per_chunk + interval within the chunk, one stream per "
    "(detector, interval) whose n deviates fill the rfft coefficients of that interval; "
    'sky: ["sky", campaign_seed, sky_seed, realization], realization = -1 when the sky is '
    "the same in every realisation; the deviates fill the a_lm (see mapmaker.model.sky)."
)


def stream_key(stream: str, *fields: int) -> tuple[int, int]:
    """Philox key (two uint64 words as Python ints) of one named stream."""
    text = json.dumps([RNG_SCHEME_VERSION, stream, *[int(f) for f in fields]], separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[0:8], "little"), int.from_bytes(digest[8:16], "little")


def noise_key(campaign_seed: int, realization: int, detector_index: int, interval_index: int) -> tuple[int, int]:
    return stream_key("noise", campaign_seed, realization, detector_index, interval_index)


def sky_key(campaign_seed: int, sky_seed: int, realization: int) -> tuple[int, int]:
    """``realization`` is -1 for a sky that does not change between realisations."""
    return stream_key("sky", campaign_seed, sky_seed, realization)


def generator(key: tuple[int, int]) -> np.random.Generator:
    """A fresh generator at counter 0 for ``key``."""
    return np.random.Generator(np.random.Philox(key=np.array(key, dtype=np.uint64)))
