"""Neutral helpers every part may use: private files, /proc readings, service notification."""
