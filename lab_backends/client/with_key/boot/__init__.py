"""The folder ``lab-backends with-key`` puts first on ``PYTHONPATH``: it holds only ``sitecustomize``."""
