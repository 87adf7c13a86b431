"""Infrastructure shared by the training code: seeding, devices, metric logging.

Nothing here imports `models` or `data`, so any of it can be reused elsewhere.
"""
