"""The work queue: claims, leases, the reaper, and overlap-plan builds."""
