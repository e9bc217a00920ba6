"""The append-only event log of state changes, and its server-sent-events stream."""
