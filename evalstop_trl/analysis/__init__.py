"""Offline analysis: replay recorded eval curves through the detectors (``evalstop replay``)."""
