"""Getting a database ready to serve: migrations (embedded default only), the schema check, local tokens."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from service.auth.models import ApiToken, User
from service.auth.service import create_token
from service.config import Settings
from service.db import Database
from service.instruments.service import sweep_stale_uploads
from service.migrate import check_schema, upgrade
from service.products.spectrum import sweep_spectrum_work

log = logging.getLogger("mapcampaign.service")

LOCAL_USER = "local"


@dataclass(frozen=True)
class LocalTokens:
    user_token_file: Path
    worker_token_file: Path
    created: bool


def prepare_data_dir(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    settings.products_dir.mkdir(parents=True, exist_ok=True)
    # Uploads cut short by a stop leave their temporary files: the instrument folder's, and the spectra's
    # work folders (each request's map and bandpowers, removed when the request ends).
    sweep_stale_uploads(settings.instrument_root)
    sweep_spectrum_work(settings.spectrum_work_dir)


def prepare_database(database: Database, settings: Settings) -> str:
    """Migrate when allowed (embedded default), then check the schema; return its revision."""
    prepare_data_dir(settings)
    if settings.should_auto_migrate:
        upgrade(database.url)
    return check_schema(database.engine)


def ensure_local_tokens(database: Database, settings: Settings) -> LocalTokens:
    """Embedded default: user ``local`` with a user token and a worker token, in files readable by the owner only."""
    tokens_dir = settings.tokens_dir
    tokens_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = {"user": tokens_dir / "local-user.token", "worker": tokens_dir / "local-worker.token"}
    created = False
    for kind, path in files.items():
        if path.exists():
            continue
        with database.session() as session:
            token = create_token(session=session, user_name=LOCAL_USER, kind=kind, label=f"local {kind} token")
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                session.rollback()  # another process made it first
                continue
            with os.fdopen(descriptor, "w") as handle:
                handle.write(token + "\n")
            session.commit()
            created = True
    return LocalTokens(user_token_file=files["user"], worker_token_file=files["worker"], created=created)


def local_user_exists(database: Database) -> bool:
    with database.session(write=False) as session:
        return session.scalar(select(User.id).join(ApiToken).where(User.name == LOCAL_USER).limit(1)) is not None
