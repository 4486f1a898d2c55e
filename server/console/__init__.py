"""The console: the /api administration group for a fleet of devices.

Accounts and levels, access and refresh tokens, device records and pairing, terminal
tokens, and proxying to a device's node API. It runs on the project's one HTTP core, beside
a node (`serve --console`) or alone (`console serve`), and never imports node internals.
"""
