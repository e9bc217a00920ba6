"""Who calls: users, bearer API tokens (stored hashed), one-time login links, and the browser's cookie sessions
with their login and logout pages."""
