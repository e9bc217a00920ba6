"""Product files a worker uploads for a realisation before it reports success.

Layout under the data folder::

    campaigns/<campaign id>/realizations/<index>/<name>                      accepted products
    campaigns/<campaign id>/realizations/.staging/attempt-<attempt id>/<name>  uploads of one attempt

An upload is written to a temporary file, hashed on the way, checked against
the sha256 the worker sent, then renamed into the attempt's staging folder
with a ``<name>.sha256`` note beside it. When the success report is accepted,
the staging folder is checked against the result's ``products`` list and
renamed as a whole to the realisation's folder: readers see all the products
or none.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from schemas.api import is_valid_artifact_name
from schemas.result import ProductFile
from service.errors import InsufficientStorage, Invalid, TooLarge

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_NOTE = ".sha256"

log = logging.getLogger("mapcampaign.service")


def _storage_failed(what: str, error: OSError) -> InsufficientStorage:
    """507 naming the operating system's cause (``No space left on device``, ``File too large``, ...)."""
    cause = f"[Errno {error.errno}] {error.strerror or os.strerror(error.errno or 0)}"
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        cause += " (the service's data folder is full or over a size limit)"
    log.warning("could not store %s: %s", what, cause)
    return InsufficientStorage(f"the service could not store {what}: {cause}; nothing was kept, try again later")


class ArtifactRejected(Invalid):
    code = "artifact_rejected"


class ArtifactTooLarge(TooLarge):
    code = "artifact_too_large"


class ProductsMissing(Invalid):
    code = "products_missing"


class ArtifactStore:
    def __init__(self, products_dir: Path):
        self.products_dir = products_dir

    def realizations_dir(self, campaign_id: int) -> Path:
        return self.products_dir / str(campaign_id) / "realizations"

    def staging_dir(self, campaign_id: int, attempt_id: int) -> Path:
        return self.realizations_dir(campaign_id) / ".staging" / f"attempt-{attempt_id}"

    def final_dir(self, campaign_id: int, index: int) -> Path:
        return self.realizations_dir(campaign_id) / str(index)

    @staticmethod
    def check_name(name: str) -> None:
        if not is_valid_artifact_name(name) or name.endswith(_NOTE):
            raise ArtifactRejected(
                f"artifact name {name!r}: use 1-128 letters, digits and _.+- starting with a letter or digit, "
                f"no '..', not ending in {_NOTE}"
            )

    @staticmethod
    def check_sha256(value: str | None) -> str:
        if value is None or not SHA256_HEX.match(value.strip().lower()):
            raise ArtifactRejected("header X-Content-SHA256: 64 lower-case hex digits of the body's SHA-256 required")
        return value.strip().lower()

    async def receive(
        self,
        chunks: AsyncIterator[bytes],
        *,
        campaign_id: int,
        attempt_id: int,
        name: str,
        sha256: str,
        max_bytes: int,
    ) -> int:
        """Store one upload in the attempt's staging folder; return its size. Replaces an earlier upload."""
        staging = self.staging_dir(campaign_id, attempt_id)
        partial = staging / f".upload-{uuid.uuid4().hex}"
        digest = hashlib.sha256()
        size = 0
        try:
            staging.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as handle:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise ArtifactTooLarge(f"artifact {name!r} is larger than the limit of {max_bytes} bytes")
                    digest.update(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            if digest.hexdigest() != sha256:
                raise ArtifactRejected(
                    f"artifact {name!r}: the body's SHA-256 is {digest.hexdigest()}, not {sha256} (X-Content-SHA256)"
                )
            # The note is what makes an upload count (check_products): written last, and atomically.
            note_partial = staging / f".note-{uuid.uuid4().hex}"
            try:
                note_partial.write_text(f"{sha256} {size}\n")
                os.replace(partial, staging / name)
                os.replace(note_partial, staging / (name + _NOTE))
            finally:
                note_partial.unlink(missing_ok=True)
        except OSError as error:
            # A write that failed (disk full, EFBIG, ...): no file of this name may look uploaded.
            for leftover in (staging / (name + _NOTE), staging / name):
                try:
                    leftover.unlink(missing_ok=True)
                except OSError:
                    pass
            raise _storage_failed(f"artifact {name!r}", error) from None
        finally:
            try:
                partial.unlink(missing_ok=True)
            except OSError:
                pass
        return size

    def check_products(self, *, campaign_id: int, attempt_id: int, products: list[ProductFile]) -> None:
        staging = self.staging_dir(campaign_id, attempt_id)
        problems = []
        for product in products:
            if not is_valid_artifact_name(product.path):
                problems.append(f"{product.path!r} is not a valid artifact name")
                continue
            note = staging / (product.path + _NOTE)
            if not note.is_file() or not (staging / product.path).is_file():
                problems.append(f"{product.path!r} was not uploaded")
                continue
            sha256, size = note.read_text().split()
            if sha256 != product.sha256.lower() or int(size) != product.size_bytes:
                problems.append(
                    f"{product.path!r} uploaded with sha256 {sha256[:12]}... and {size} bytes, "
                    f"result says {product.sha256[:12]}... and {product.size_bytes} bytes"
                )
        if problems:
            raise ProductsMissing("result.products: " + "; ".join(problems))

    def publish(
        self, *, campaign_id: int, attempt_id: int, index: int, products: list[ProductFile]
    ) -> Callable[[], None]:
        """Move the attempt's products into the realisation folder in one rename; return an undo."""
        staging = self.staging_dir(campaign_id, attempt_id)
        final = self.final_dir(campaign_id, index)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            staging.mkdir(parents=True, exist_ok=True)
            keep = {product.path for product in products}
            for entry in staging.iterdir():
                if entry.name not in keep:  # notes, partial uploads, files the result does not name
                    entry.unlink(missing_ok=True) if entry.is_file() else shutil.rmtree(entry, ignore_errors=True)
            if final.exists():
                # Only a crash between a rename and its commit leaves this: that result was never accepted.
                leftover = final.with_name(f".replaced-{index}-{uuid.uuid4().hex}")
                os.rename(final, leftover)
                shutil.rmtree(leftover, ignore_errors=True)
            os.rename(staging, final)
        except OSError as error:  # nothing was moved into place, so nothing is accepted
            raise _storage_failed(f"the products of realisation {index}", error) from None

        def undo() -> None:
            os.rename(final, staging)

        return undo

    def discard(self, *, campaign_id: int, attempt_id: int | None = None) -> None:
        """Drop the uploads of one ended attempt, or of every attempt of the campaign."""
        folder = (
            self.staging_dir(campaign_id, attempt_id)
            if attempt_id is not None
            else (self.realizations_dir(campaign_id) / ".staging")
        )
        shutil.rmtree(folder, ignore_errors=True)
