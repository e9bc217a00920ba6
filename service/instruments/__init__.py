"""TOAST files uploaded to the service: checked, and stored once by checksum under the instrument_root."""
