"""The console dashboard's settings and their bounds (docs/console.md), apart from the service so
that the daemon's settings check reads them without importing the console."""

# setting -> (lowest, highest) accepted
DASHBOARD_LIMITS = {"dashboard_interval": (0.5, 60.0), "dashboard_samples": (10, 100_000),
                    "dashboard_devices": (1, 1000), "dashboard_days": (1, 90)}
