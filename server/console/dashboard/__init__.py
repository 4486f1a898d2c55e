"""The dashboard's data: each device's /metrics sampled into a history (15 minutes in memory,
days at one-minute resolution in the database), and the latest view of its cluster and models.
The page and /api read only from here, never from a device: a slow device cannot slow them."""
