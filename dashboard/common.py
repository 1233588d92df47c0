"""Kept only because ``tests/conftest.py`` (not the dashboard's file) imports the
process-wide resources from here: they live in ``dashboard/resources.py``. Remove this module
once conftest imports ``dashboard.resources``; nothing in the dashboard imports it."""

from dashboard.resources import get_manager, get_store

__all__ = ["get_manager", "get_store"]
