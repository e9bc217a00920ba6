"""Users and bearer API tokens (stored hashed)."""
