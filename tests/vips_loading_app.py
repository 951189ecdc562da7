"""A Celery app module that loads libvips before gcis_etl.worker, as a site's own module importing pyvips at its
top would: the worker must refuse to start (tests/test_celery_walk2.py)."""
import pyvips

from gcis_etl.worker import app

__all__ = ["app"]
LIBVIPS = pyvips.version(0)
