"""Helpers every command module shares: settings that fail with a readable message, errors on stderr."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from service.config import Settings


def fail(message: str, *, hint: str | None = None, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(code)


def load_settings(**overrides: Any) -> Settings:
    from pydantic import ValidationError

    from schemas.io import plain_message
    from service.config import Settings

    try:
        return Settings(**{key: value for key, value in overrides.items() if value is not None})
    except ValidationError as error:
        problems = "; ".join(
            f"MAPCAMPAIGN_{'_'.join(str(part) for part in item['loc']).upper()}: {plain_message(item['msg'])}"
            for item in error.errors()
        )
        fail(f"bad settings: {problems}", code=2)
