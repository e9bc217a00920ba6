"""Workers (site agents) and the endpoints they call."""
